"""A trial's estimate over placements and its interval, and the one placement loop every runner applies."""
import json
import math
import random

import pytest

from opbench.hardware.host_speed import Slowness
from opbench.measure.estimate import INTERVAL_FLOOR, estimate, split, wants_placement
from opbench.measure.protocol import RunInput, RunResult
from opbench.measure.runner.local import LocalRunner
from opbench.measure.runner.placements import joined, place
from opbench.measure.series import latency_stats
from opbench.measure.timing import TimingPolicy
from opbench.record import Status

MATMUL = "matmul:m=8,n=8,k=8"


def test_a_slow_placement_is_not_the_estimate_and_the_interval_holds_a_known_value():
    est = estimate([1.01, 1.60, 1.00, 1.02], agree=0.03)  # one process in four runs 60% slow
    assert est.latency_s == 1.00 and est.agreeing == 3 and est.placements == 4
    spread = 1 + INTERVAL_FLOOR + 0.01  # the floor and the second fastest's distance
    assert est.lo_s == pytest.approx(1.00 / spread) and est.hi_s == pytest.approx(1.00 * spread)
    assert est.lo_s <= 1.02 <= est.hi_s and not est.lo_s <= 1.6 <= est.hi_s  # a known value held, the slow one not


def test_disagreeing_placements_give_a_wide_interval_and_a_lone_one_a_positive_one():
    agreeing, apart = estimate([1.0, 1.01, 1.3], agree=0.03), estimate([1.0, 1.2, 1.5], agree=0.03)
    assert apart.latency_s == 1.0 and apart.agreeing == 0  # none agreed with the fastest
    assert apart.lo_s < agreeing.lo_s and apart.hi_s > 1.2 > agreeing.hi_s  # wide: the number is this uncertain
    one = estimate([2.0], agree=0.03)
    assert one.latency_s == 2.0 and one.agreeing == 0 and 0 < one.lo_s < 2.0 < one.hi_s
    assert estimate([1.0, 3.0], agree=0.03).lo_s > 0  # however far apart
    with pytest.raises(ValueError):
        estimate([], agree=0.03)


def test_a_trial_takes_placements_until_two_agree_and_none_stands_apart_faster_within_its_bounds():
    assert wants_placement([], 0.03, least=3, most=6)
    assert wants_placement([1.0, 1.01], 0.03, least=3, most=6)  # fewer than the least
    assert not wants_placement([1.0, 1.01, 1.5], 0.03, least=3, most=6)  # the fastest two agree
    assert wants_placement([1.0, 1.1, 1.2], 0.03, least=3, most=6)  # none agree yet
    assert wants_placement([1.18, 2.37, 2.34], 0.03, least=3, most=6)  # two slowed alike, the fast one apart
    assert not wants_placement([1.18, 2.37, 2.34, 1.19], 0.03, least=3, most=6)  # confirmed
    assert not wants_placement([1.20, 1.245, 1.248], 0.03, least=3, most=6)  # 4% apart: within twice agree
    assert estimate([1.18, 2.37, 2.34, 1.19], 0.03).latency_s == 1.18
    assert not wants_placement([1.0, 1.1, 1.2, 1.3, 1.4, 1.5], 0.03, least=3, most=6)  # the most: stop


def test_a_records_cv_is_the_spread_within_its_placements_not_between_them():
    placements = [[1.0e-3, 1.1e-3], [2.0e-3, 2.1e-3], [1.5e-3, 1.6e-3]]  # three steady placements, three speeds
    apart, together = latency_stats(placements), latency_stats([[t for p in placements for t in p]])
    assert together["latency_cv"] > 0.25 and apart["latency_cv"] == pytest.approx(0.0707 / 1.55, rel=1e-3)
    assert apart["latency_ms_std"] == together["latency_ms_std"] and apart["latency_ms"] == pytest.approx(1.55)
    assert split([1, 2, 3, 4, 5], [2, 3]) == [[1, 2], [3, 4, 5]] and split([1, 2], []) == [[1, 2]]


class _Job:
    def __init__(self, name, **timing):
        self.name, self.timing = name, TimingPolicy(**timing)


def test_placements_are_taken_in_rounds_in_random_order_and_a_failure_stops_its_job():
    values = {"steady": iter([1.0, 1.01, 1.02]), "split": iter([1.0, 1.2, 1.4, 1.5, 1.21]),
              "failed": iter([1.0, None])}
    calls = []

    def call(i):
        name = jobs[i].name
        calls.append(name)
        ms = next(values[name])
        if ms is None:
            return RunResult(Status.RUN_ERROR, "run: crashed")
        return RunResult(Status.OK, latencies_s=[ms * 1e-3] * 2, run_s=0.1, load={"other_busy_frac": ms - 1})

    jobs = [_Job(n, placements=3, max_placements=5, agree=0.03) for n in ("steady", "split", "failed")]
    steady, split_, failed = place(jobs, call, random.Random(1))
    assert sorted(calls[:3]) == sorted(calls[3:6]) == ["failed", "split", "steady"]  # every job once a round
    assert sorted(calls[6:8]) == ["split", "steady"]  # failed stopped at its failure
    assert calls[8:] == ["split", "split"]  # steady agreed after three; split only on its fifth
    assert steady.placements == 3 and steady.latencies_s == pytest.approx([1e-3, 1e-3, 1.01e-3, 1.01e-3, 1.02e-3, 1.02e-3])
    assert split_.placements == 5 and split_.run_s == pytest.approx(0.5)  # 1.2 and 1.21 agree on the fifth
    assert split_.load["other_busy_frac"] == pytest.approx(0.5)  # the busiest placement's
    assert failed.status is Status.RUN_ERROR and failed.error == "run: crashed"
    orders = set()
    for seed in range(8):  # the order within a round is random, not fixed
        calls.clear()
        values.update(steady=iter([1.0] * 3), split=iter([1.0] * 3), failed=iter([1.0] * 3))
        place(jobs, call, random.Random(seed))
        orders.add(tuple(calls[:3]))
    assert len(orders) > 1


def test_one_placement_is_its_own_result():
    only = RunResult(Status.OK, latencies_s=[1e-3], load={"other_busy_frac": 0.2})
    assert joined([only]) is only and only.placements == 1


class _Probe:
    def __init__(self, *slowness):
        self.slowness_of = list(slowness)

    unsettled_for_s = 0.0

    def slowness(self, cpus):
        return self.slowness_of.pop(0)

    def unsettled_s(self, cpus):
        return self.unsettled_for_s


class _Worker:
    alive = True

    def __init__(self, *ms):
        self.ms, self.closed = list(ms), False

    def call(self, inp, timeout_s):
        return RunResult(Status.OK, latencies_s=[self.ms.pop(0) * 1e-3], run_s=0.1, load={"other_busy_frac": 0.0})

    def close(self):
        self.closed = True


def test_the_local_runner_probes_before_each_placement_and_keeps_the_furthest_from_usual(monkeypatch):
    worker = _Worker(1.0, 1.3, 1.01)
    monkeypatch.setattr(LocalRunner, "_worker", lambda self, resources, role: worker)
    probe = _Probe(Slowness(1.0, 1.0), Slowness(1.4, 1.0), Slowness(0.98, 1.02))
    (result,) = LocalRunner(speed=probe).run_batch([RunInput("", MATMUL, TimingPolicy(placements=3))])
    assert result.placements == 3 and result.latencies_s == pytest.approx([1e-3, 1.3e-3, 1.01e-3])
    assert result.load["host_slowness"] == 1.4 and result.host_wait_s > 0 and not probe.slowness_of


def test_a_placement_waits_while_the_host_is_unsettled_until_it_has_been_for_the_bound(monkeypatch, caplog):
    from opbench.measure.runner import local

    monkeypatch.setattr(local, "SETTLE_POLL_S", 0.01)
    worker = _Worker(1.0, 1.01, 1.2, 1.3)
    monkeypatch.setattr(LocalRunner, "_worker", lambda self, resources, role: worker)
    apart, spell, settled = Slowness(1.0, 1.0, 1.0, 3.5), Slowness(1.6, 1.8, 1.7, 1.0), Slowness(1.0, 1.0, 1.0, 1.05)
    assert apart.cores_apart and not settled.cores_apart and not Slowness(1.0, 1.0).cores_apart  # NaN: not probed
    assert not apart.settled and not spell.settled and settled.settled and Slowness(1.0, 1.0).settled
    assert Slowness(0.8, 1.15, 1.1).settled and not Slowness(1.0, 1.0, 1.3).settled  # a little slower: no spell
    two = TimingPolicy(placements=2, max_placements=2)
    probe = _Probe(apart, spell, settled, settled)
    with caplog.at_level("INFO", logger="opbench"):
        (result,) = LocalRunner(speed=probe).run_batch([RunInput("", MATMUL, two)])
    assert result.latencies_s == pytest.approx([1e-3, 1.01e-3]) and result.load["host_slowness"] == 1.0 and not probe.slowness_of
    assert result.host_wait_s >= 2 * local.SETTLE_POLL_S  # two probes found the host unsettled: it waited twice
    # the wait is said once, with what the first unsettled probe found
    assert [r.getMessage() for r in caplog.records] == [
        "the host is busy (its cores sharing no cache): placements wait for it to settle, for up to 120 s"]
    assert spell.unsettled_by() == ("compute 1.60x its usual time, memory 1.80x its usual time, "
                                    "parallel 1.70x its usual time") and settled.unsettled_by() == ""
    probe = _Probe(spell, spell)
    probe.unsettled_for_s = local.SETTLE_WAIT_S  # unsettled this long already: the placements run, their state recorded
    (result,) = LocalRunner(speed=probe).run_batch([RunInput("", MATMUL, two)])
    assert result.latencies_s == pytest.approx([1.2e-3, 1.3e-3]) and result.load["host_slowness"] == 1.6
    worker.ms, probe = [1.1], _Probe(spell)  # one placement, a quick estimate: it takes the host as it finds it
    (result,) = LocalRunner(speed=probe).run_batch([RunInput("", MATMUL, TimingPolicy(placements=1, max_placements=1))])
    assert result.latencies_s == [1.1e-3] and result.load["host_memory_slowness"] == 1.8


def test_a_fresh_measurement_takes_each_placement_in_a_new_process(monkeypatch):
    made = []

    def fresh(self, inp):
        made.append(_Worker(1.0))
        return made[-1]

    monkeypatch.setattr(LocalRunner, "_fresh_worker", fresh)
    (result,) = LocalRunner().run_fresh([RunInput("", MATMUL, TimingPolicy(placements=3))])
    assert result.placements == 3 and len(made) == 3 and all(w.closed for w in made)


def test_the_peak_is_measured_once_per_key_and_kept(tmp_path):
    from opbench.hardware.peak import PeakCache, peak_flops, vector_lanes

    assert vector_lanes(("sse2", "avx", "avx2", "fma")) == 8 and vector_lanes(("avx512f", "avx2")) == 16
    assert vector_lanes(("neon",)) == 4 and vector_lanes(("avx2",), "float16") == 16
    assert peak_flops(2, 8, chains=12, iterations=10) == 2 * 2 * 12 * 8 * 10
    cache, measured = PeakCache(tmp_path / "peaks.json"), []
    key = PeakCache.key("AuthenticAMD/25.1.1/2c/x", 2, "any", "float32", "fma")
    assert cache.get_or_measure(key, lambda: measured.append(1) or 150.0) == 150.0
    assert cache.get_or_measure(key, lambda: measured.append(1) or 99.0) == 150.0 and len(measured) == 1  # kept
    other = PeakCache.key("AuthenticAMD/25.17.0/2c/y", 2, "any", "float32", "fma")  # another CPU: measured anew
    assert cache.get_or_measure(other, lambda: None) is None and key in (tmp_path / "peaks.json").read_text()
    assert other not in (tmp_path / "peaks.json").read_text()  # a failed measurement is not kept
    assert (tmp_path / "peaks.json").stat().st_mode & 0o077 == 0
    # a kernel outran the peak (measured in a slow spell): measured again, once a process, the higher kept
    assert cache.get_or_measure(key, lambda: measured.append(1) or 170.0, reached=160.0) == 170.0 and len(measured) == 2
    assert cache.get_or_measure(key, lambda: measured.append(1) or 190.0, reached=180.0) == 170.0 and len(measured) == 2
    assert PeakCache(tmp_path / "peaks.json").get_or_measure(key, lambda: 0.0) == 170.0  # kept for the next process
    assert PeakCache(tmp_path / "peaks.json").get_or_measure(key, lambda: 120.0, reached=175.0) == 170.0  # never lowered


def test_peak_frac_divides_by_the_measured_peak_and_is_absent_without_one(measurer, monkeypatch, tmp_path):
    from opbench.hardware.peak import PeakCache
    from opbench.hardware.resources import Resources
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import TrialSpec
    from opbench.workloads import parse_workload

    monkeypatch.setattr(measurer, "_peaks", PeakCache(tmp_path / "peaks.json"))  # nothing known yet
    peak = measurer.peak_gflops(Resources(1))
    assert peak is not None and peak > 1.0  # measured by its kernel, in a kernel worker, through the runner
    assert str(peak) in (tmp_path / "peaks.json").read_text()
    assert measurer.peak_gflops(Resources(1)) == peak  # kept: not measured again
    spec = TrialSpec(parse_workload("matmul:m=64,n=64,k=64"), {}, Resources(1))
    record = measurer.measure(spec)
    peak = measurer.peak_gflops(Resources(1))  # the one kept: measured again, the higher kept, had the kernel outrun it
    assert record["peak_frac"] == pytest.approx(record["gflops"] / peak)
    # Winograd computes fewer FLOPs than the direct convolution its gflops counts: peak_frac counts what it computes
    conv = parse_workload("conv2d:n=1,c=16,h=8,w=8,k=16,r=3,s=3,stride=1,pad=1")
    winograd = measurer.measure(TrialSpec(conv, {"algorithm": "winograd", "winograd_tile": 4}, Resources(1)))
    computed = 2 * 36 * 4 * 16 * 16 + 4 * 6 ** 3 * 4 * 16 + 2 * (4 * 36 + 16 * 6) * 4 * 16 + 2 * (54 + 108) * 16 * 16
    peak = measurer.peak_gflops(Resources(1))
    assert winograd["peak_frac"] == pytest.approx(computed / 1e6 / winograd["latency_ms"] / peak, rel=1e-6)
    assert winograd["peak_frac"] < winograd["gflops"] / peak  # 4 tiles of F(4x4): fewer than 2 x 9 x 8 x 8 x 16 x 16
    monkeypatch.setattr(Measurer, "peak_gflops", lambda self, resources, dtype="float32", reached=0.0: None)
    assert "peak_frac" not in measurer.measure(spec) and measurer.measure(spec)["gflops"] > 0


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_a_low_precision_record_divides_by_the_peak_of_the_hosts_dot_product_instruction(measurer, monkeypatch, tmp_path,
                                                                                        dtype):
    from opbench.hardware.peak import PeakCache
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec
    from opbench.space import get_template
    from opbench.space.dot_product import instruction
    from opbench.space.peak_units import peak_of
    from opbench.workloads import parse_workload

    monkeypatch.setattr(measurer, "_peaks", PeakCache(tmp_path / "peaks.json"))
    dot = instruction(dtype, frozenset(measurer.host.isa))
    if dot is None:
        pytest.skip(f"this CPU has no {dtype} dot-product instruction of ours: {dtype} records have no peak_frac")
    fp32, peak = measurer.peak_gflops(Resources(1)), measurer.peak_gflops(Resources(1), dtype)
    assert fp32 and peak  # each its own kernel's (how they compare is the host's: a timing, not asserted here)
    assert set(json.loads((tmp_path / "peaks.json").read_text())) == {
        PeakCache.key(measurer.host.device_key, 1, "any", each, peak_of(each, measurer.host.isa, 1).unit)  # type: ignore[union-attr]
        for each in ("float32", dtype)}
    workload = parse_workload(f"dense:m=16,n=64,k=64,dtype={dtype}")
    record = measurer.measure(TrialSpec(workload, {}, Resources(1)))
    assert record["template"] == get_template(workload).name  # AMX tiles or the dot-product instruction: one peak
    assert record["peak_frac"] == pytest.approx(record["gflops"] / peak, rel=1e-6)


def test_re_measures_calibrate_a_devices_interval_once_there_are_enough(tmp_path):
    from opbench.measure.calibration import MIN_OBSERVED, WINDOW, Calibration

    calibration = Calibration(tmp_path / "calibration.json")
    calibration.observe("zen3", 2.0, [2.0] * (MIN_OBSERVED - 1))
    assert calibration.bounds("zen3") is None  # too few to calibrate: the placements' interval alone
    calibration.observe("zen3", 1.0, [0.9 + 0.01 * i for i in range(81)])  # re-measures 0.9x to 1.7x the record
    calibration.observe("zen3", 1.0, [math.nan, -1.0, math.inf])  # a failed read is no re-measure
    bounds = calibration.bounds("zen3")
    assert bounds is not None and bounds.observed == MIN_OBSERVED - 1 + 81
    assert 0.9 < bounds.low < 1.0 < 1.5 < bounds.high < 1.7  # the middle 90% of the ratios
    assert calibration.bounds("zen4") is None  # another device knows nothing of this one's
    calibration.observe("zen3", 1.0, [5.0] * WINDOW)
    assert calibration.bounds("zen3") == type(bounds)(5.0, 5.0, WINDOW)  # the latest WINDOW, the oldest dropped


def _observe_ten(path, value):
    from opbench.measure.calibration import Calibration

    for _ in range(10):
        Calibration(path).observe("zen3", 1.0, [value])


def test_verifications_observing_at_once_each_keep_their_ratios(tmp_path):
    import multiprocessing

    from opbench.measure.calibration import Calibration

    path = tmp_path / "calibration.json"
    processes = [multiprocessing.get_context("fork").Process(target=_observe_ten, args=(path, 1.0 + i)) for i in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0] * 4
    ratios = sorted(Calibration(path)._ratios()["zen3"])
    assert ratios == sorted([1.0 + i for i in range(4)] * 10)  # none lost to another's read-modify-write


def test_a_calibrated_device_widens_a_records_interval_to_its_re_measures(measurer, tmp_path):
    from opbench.hardware.resources import Resources
    from opbench.measure.calibration import Calibration
    from opbench.measure.types import TrialSpec
    from opbench.workloads import parse_workload

    spec = TrialSpec(parse_workload(MATMUL), {}, Resources(1), "te_default")
    saved = measurer.calibration
    measurer.calibration = Calibration(tmp_path / "calibration.json")
    try:
        placements_only = measurer.measure(spec)
        measurer.calibration.observe(measurer.host.device_key, 1.0, [0.8] * 10 + [1.0] * 20 + [1.5] * 10)
        calibrated = measurer.measure(spec)
    finally:
        measurer.calibration = saved
    assert placements_only["interval_calibration"] == 0 and calibrated["interval_calibration"] == 40
    est = calibrated["latency_ms"]
    assert calibrated["latency_lo_ms"] <= 0.8 * est + 1e-12 and calibrated["latency_hi_ms"] >= 1.5 * est - 1e-12


def test_the_reproducibility_benchmark_calibrates_each_workload_by_the_others_re_measures(tmp_path, monkeypatch):
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    reproducibility = importlib.import_module("reproducibility")

    def process(ms):
        return {"status": "ok", "latency_ms": ms, "latency_lo_ms": ms * 0.99, "latency_hi_ms": ms * 1.01,
                "placement_ms": [ms, ms * 1.02]}

    records = {(name, i): [process(1.0 * scale) for _ in range(4)] + [process(1.3 * scale)]
               for name, scale in (("a", 1.0), ("b", 2.0)) for i in range(2)}  # one process in five 30% slow
    rows, _, hits, _ = reproducibility.target_rows(records)
    assert [row[5] for row in rows] == pytest.approx([1.02] * 4)  # placements agreed within each process
    calibrated, widths = reproducibility.calibrated_hits(records, tmp_path)
    assert sum(hits) / len(hits) == pytest.approx(12 / 20)  # the slow process falls outside every other's interval
    assert len(calibrated) == len(hits) and all(calibrated)  # the other workload's re-measures saw it coming
    assert min(widths) > 0.2  # ... at the cost of a wide interval
    share, by_round = reproducibility.group_effect(records, lambda i, r: i)
    assert share == pytest.approx(1.0)  # every config was slow in the same (last) round: the host's state then
    assert by_round[4][0] / by_round[0][0] == pytest.approx(1.3) and by_round[4][1] == 4
    records[("a", 0)][4] = process(1.0)  # one config did not slow down in that round
    assert reproducibility.group_effect(records, lambda i, r: i)[0] < 1.0
    records[("b", 1)][4]["host_memory_slowness"] = 1.5  # the host's state explains what it explains of the rest
    share, by_state = reproducibility.group_effect(records, lambda i, r: reproducibility._settled(r))
    assert 0 < share < 1 and by_state[False][1] == 1 and by_state[False][0] / by_state[True][0] > 1.2


def test_the_placements_a_trial_takes_come_from_the_environment_where_set(monkeypatch):
    from opbench import settings
    from opbench.exceptions import OpBenchError

    monkeypatch.setenv("OPBENCH_PLACEMENTS", "2")
    monkeypatch.setenv("OPBENCH_MAX_PLACEMENTS", "1")
    assert (TimingPolicy().placements, TimingPolicy().max_placements) == (2, 2)  # the most never below the least
    monkeypatch.delenv("OPBENCH_PLACEMENTS")
    monkeypatch.delenv("OPBENCH_MAX_PLACEMENTS")
    assert (TimingPolicy().placements, TimingPolicy().max_placements) == (settings.PLACEMENTS, settings.MAX_PLACEMENTS)
    monkeypatch.setenv("OPBENCH_PLACEMENTS", "0")
    with pytest.raises(OpBenchError, match=r"\$OPBENCH_PLACEMENTS must be >= 1, got 0"):
        TimingPolicy()
