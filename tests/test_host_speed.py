"""The host-speed probe: its normal time, waiting out spells, and what it gives every record."""
import json
import math
import statistics

import pytest

from opbench.hardware.host_speed import (
    HISTORY,
    MIN_HISTORY,
    PARALLEL_PROBE_CALLS,
    PROBE_CALLS,
    RECENT_PROBES,
    RECENT_S,
    HostSpeed,
    Probe,
    Slowness,
    furthest_from_usual,
    probe_cpus,
    probe_ms,
    usual_time,
)


class _Host:
    """Probe times in turn (a compute time, or a (compute, memory[, parallel]) tuple)."""

    def __init__(self, times):
        self.times, self.now = list(times), 0.0

    def probe(self, cpus):
        assert cpus == [0, 1]
        taken = self.times.pop(0)
        return Probe(*taken) if isinstance(taken, tuple) else Probe(taken, 1.0)


def _speed(tmp_path, times, name="speed.json", wall=None):
    host = _Host(times)
    return HostSpeed(tmp_path / name, host.probe, wall or (lambda: host.now)), host


def test_slowness_is_a_probe_over_the_usual_time_of_the_probes_before_it(tmp_path):
    speed, _ = _speed(tmp_path, [1.0, 1.1, 0.9, 1.0, 1.0, 1.6, 0.85])
    for _ in range(MIN_HISTORY):  # nothing to judge by yet
        first = speed.slowness([0, 1])
        assert math.isnan(first.compute) and math.isnan(first.memory) and first.usual
    assert speed.slowness([0, 1]).compute == pytest.approx(1.6)
    assert speed.slowness([0, 1])[:2] == pytest.approx((0.85, 1.0))  # 1.0, 1.1, 0.9, 1.0, 1.0, 1.6: usual 1.0
    again, _ = _speed(tmp_path, [(2.0, 0.7)])  # another process on the same host: the history is in the file
    assert again.slowness([0, 1])[:2] == pytest.approx((2.0, 0.7))


def test_either_loop_outside_the_tolerance_leaves_the_usual_state():
    assert Slowness(1.05, 0.95).usual and Slowness(math.nan, math.nan).usual
    assert not Slowness(1.0, 0.75).usual and Slowness(1.0, 0.75).deviation == pytest.approx(0.25)
    assert not Slowness(1.3, 1.0).usual
    assert furthest_from_usual([math.nan, 0.8, 1.1]) == 0.8 and math.isnan(furthest_from_usual([math.nan]))


def test_the_parallel_loop_is_judged_as_the_others_and_a_spell_of_any_unsettles_the_host(tmp_path):
    assert Slowness(1.0, 1.0, 1.05).usual and not Slowness(1.0, 1.0, 1.15).usual and Slowness(1.0, 1.0, 1.15).settled
    assert Slowness(1.0, 0.75, 1.3).deviation == pytest.approx(0.3) and not Slowness(1.0, 1.0, 1.3).settled
    speed, _ = _speed(tmp_path, [(1.0, 1.0, 2.0)] * MIN_HISTORY + [(1.0, 1.0, 3.0), (1.0, 1.0)])
    for _ in range(MIN_HISTORY):
        speed.slowness([0, 1])
    assert speed.slowness([0, 1]).sync == pytest.approx(1.5)
    without = speed.slowness([0, 1])  # a probe without the loop (NaN) judges by the others
    assert math.isnan(without.sync) and without.usual
    assert len(json.loads((tmp_path / "speed.json").read_text())["0,1:parallel"]) == MIN_HISTORY + 1  # none: no entry


def test_the_history_keeps_the_latest_probes_per_cpu_set(tmp_path):
    speed, _ = _speed(tmp_path, [1.0] * (HISTORY + 3))
    for _ in range(HISTORY + 3):
        speed.slowness([0, 1])
    kept = json.loads((tmp_path / "speed.json").read_text())
    assert {k: len(v) for k, v in kept.items()} == {"0,1": HISTORY, "0,1:memory": HISTORY, "0,1:settled": HISTORY}  # no parallel loop


def test_the_probe_runs_a_thread_on_each_cpu_of_the_measurement():
    assert probe_cpus(3, (4, 5)) == [4, 5, 4] and probe_cpus(1, (7,)) == [7]
    taken = probe_ms(probe_cpus(2, None))  # it ran on both CPUs and came back
    assert taken.compute_ms > 0 and taken.memory_ms > 0 and taken.sync_ms > 0 and taken.exchange_ms > 0
    assert math.isnan(probe_ms([0]).exchange_ms)  # one thread has no other's writes to read


def test_the_exchange_loop_reads_the_buffer_the_other_thread_has_just_written(tmp_path):
    """Each round: this thread writes its own buffer, waits for the other, then sums the other's (the value of the
    round it wrote), timed; the exchange slowness is judged against its own history, as the other loops'."""
    import numpy as np

    from opbench.hardware import host_speed

    mine, theirs = np.zeros(4, np.float32), _SummedBuffer(4)
    host_speed._exchange_ms(mine, theirs, lambda: theirs.fill(len(theirs.sums)))  # the "other thread" writes
    assert theirs.sums == [4.0 * r for r in range(host_speed.EXCHANGE_PROBE_ROUNDS)]  # each round's fresh writes
    assert (mine == host_speed.EXCHANGE_PROBE_ROUNDS - 1).all()
    exchange_ms = iter([1.0] * 6 + [2.0])
    speed = HostSpeed(tmp_path / "speed.json", probe=lambda cpus: Probe(1.0, 1.0, 1.0, next(exchange_ms)))
    judged = [speed.slowness([0, 1]).exchange for _ in range(7)]
    assert all(map(math.isnan, judged[:5])) and judged[5:] == [1.0, 2.0]


def test_the_cores_apart_are_judged_by_the_fastest_twentieth_however_long_they_last_and_timed_since_they_began(tmp_path):
    now = [0.0]
    exchange_ms = iter([1.0] * 5 + [3.5] * 40 + [1.1])  # the cores shared a cache, then none for 40 probes
    speed = HostSpeed(tmp_path / "speed.json", lambda cpus: Probe(1.0, 1.0, 1.0, next(exchange_ms)), lambda: now[0])
    judged = []
    for _ in range(45):
        judged.append(speed.slowness([0, 1]))
        now[0] += 1.0
    assert judged[5].cores_apart and judged[44].cores_apart  # still apart: the slow probes outnumber the usual 8 to 1
    assert judged[44].exchange == pytest.approx(3.5) and speed.unsettled_s([0, 1]) == pytest.approx(40.0)
    assert HostSpeed(tmp_path / "speed.json", wall=lambda: now[0]).unsettled_s([0, 1]) == pytest.approx(40.0)  # kept
    assert not speed.slowness([0, 1]).cores_apart and speed.unsettled_s([0, 1]) == 0.0  # shared again


def test_a_spell_the_compute_probe_reads_leaves_the_host_unsettled_from_its_first_probe(tmp_path):
    now = [0.0]
    compute_ms = iter([1.0] * 8 + [1.7] * 3 + [1.0])
    speed = HostSpeed(tmp_path / "speed.json", lambda cpus: Probe(next(compute_ms), 1.0, 1.0, 1.0), lambda: now[0])
    for _ in range(11):
        slowness = speed.slowness([0, 1])
        now[0] += 2.0
    assert not slowness.settled and slowness.usual is False and speed.unsettled_s([0, 1]) == pytest.approx(6.0)
    assert speed.slowness([0, 1]).settled and speed.unsettled_s([0, 1]) == 0.0


class _SummedBuffer:
    """A buffer the "other thread" fills at the barrier; its sums are kept."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.values, self.sums = np.zeros(size, np.float32), list[float]()

    def fill(self, value: float) -> None:
        self.values.fill(value)

    def sum(self) -> float:
        self.sums.append(float(self.values.sum()))
        return self.sums[-1]


@pytest.mark.parametrize("command", [["measure", "matmul:m=8,n=8,k=8"], ["tune-model", "bert-base@tiny"],
                                     ["model-ops", "bert-base@tiny"]])
def test_placement_flags_are_measure_options_and_bad_ones_are_refused(command, capsys):
    from opbench.cli import main

    for flag, value in (("--placements", "0"), ("--max-placements", "-1"), ("--agree", "nan")):
        with pytest.raises(SystemExit) as exit_:
            main([*command, flag, value])
        assert exit_.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err
    assert main([*command, "--placements", "4", "--max-placements", "3"]) == 2
    assert "--max-placements 3 is below --placements 4" in capsys.readouterr().err


def test_a_model_specs_timing_reaches_its_measurer_in_the_cold_cache_state():
    from opbench.measure.timing import TimingPolicy
    from opbench.studies.models.tune import ModelSpec, model_measurer

    timing = model_measurer(ModelSpec("bert-base@tiny", timing=TimingPolicy(repeat=2, placements=1, max_placements=1))
                            ).options.timing
    assert (timing.repeat, timing.placements, timing.max_placements, timing.cache_flush) == (2, 1, 1, True)


def test_the_usual_time_of_a_host_switching_between_states_is_the_most_frequent_one(tmp_path):
    switching = [0.8, 0.81, 0.79] * 3 + [1.0] * 6 + [1.3] * 6  # 9 probes in a fast state, 6 and 6 in two others
    assert statistics.median(switching) == pytest.approx(1.0)  # ... where the fast state reads 20% off
    assert usual_time(switching) == pytest.approx(0.8)
    assert usual_time([1.0, 1.1, 0.9, 1.0, 1.0, 1.6]) == pytest.approx(1.0)  # one state: its median
    wide = [1.0, 1.2, 1.21]  # one band holds them all: its median moved as little as that needs
    assert usual_time(wide) == pytest.approx(1.0 / 0.9) and all(abs(x / usual_time(wide) - 1) <= 0.1 + 1e-9 for x in wide)
    speed, _ = _speed(tmp_path, [(1.0, x) for x in switching] + [(1.0, 0.8), (1.0, 1.0)])
    for _ in switching:
        speed.slowness([0, 1])
    assert speed.slowness([0, 1]).usual and not speed.slowness([0, 1]).usual  # the fast state is the usual one


def test_a_host_whose_state_changed_for_good_is_judged_by_its_recent_probes(tmp_path):
    """An hour of probes in one state, then the host runs 2x faster for good: the new state becomes the usual
    one once the last RECENT_S seconds hold RECENT_PROBES probes, not after HISTORY / 2 of them."""
    now = [0.0]
    speed, _ = _speed(tmp_path, [2.0] * 100 + [1.0] * (RECENT_PROBES + 1), wall=lambda: now[0])
    for i in range(100):
        now[0] = i * 36.0  # an hour of studies
        speed.slowness([0, 1])
    now[0] = 3600 + RECENT_S
    fast = [speed.slowness([0, 1]) for _ in range(RECENT_PROBES + 1)]
    assert [s.compute for s in fast[:RECENT_PROBES]] == pytest.approx([0.5] * RECENT_PROBES)  # the hour's 2.0 still
    assert not any(s.usual for s in fast[:RECENT_PROBES]) and fast[-1].usual and fast[-1].compute == pytest.approx(1.0)
    old = json.loads((tmp_path / "speed.json").read_text())
    (tmp_path / "speed.json").write_text(json.dumps({key: [ms for _, ms in probes] for key, probes in old.items()}))
    again, _ = _speed(tmp_path, [1.0])  # an older OpBench's history (no times): left out, nothing to judge by
    assert math.isnan(again.slowness([0, 1]).compute)


class _FakeClockMatrix:
    """A probe matrix whose every product takes 1 ms of a fake clock (``now``), counted in ``products``."""

    now, products = 0.0, 0

    def __matmul__(self, other):
        type(self).now += 1e-3
        type(self).products += 1
        return self


def test_each_probe_thread_keeps_its_core_busy_before_it_times(monkeypatch):
    """A core that idled runs its first milliseconds slow (here a core idle for 300 ms read the compute loop
    1.44x slow, 0.98x after a 10-ms warm-up): every probe first keeps its cores busy, 10 ms by default."""
    from opbench.hardware import host_speed

    monkeypatch.setattr(host_speed, "_probe_matrix", lambda size: _FakeClockMatrix())
    monkeypatch.setattr(host_speed.time, "perf_counter", lambda: _FakeClockMatrix.now)
    taken = probe_ms([0])
    assert _FakeClockMatrix.products == 10 + PROBE_CALLS + PARALLEL_PROBE_CALLS  # 1 ms a product
    assert taken.compute_ms == pytest.approx(1.0) and taken.sync_ms == pytest.approx(1.0)
