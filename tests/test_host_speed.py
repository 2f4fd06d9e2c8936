"""The host-speed probe: its normal time, waiting out spells, and what it gives every record."""
import json
import math

import pytest

from opbench.measure.host_speed import HISTORY, MIN_HISTORY, POLL_S, HostSpeed, probe_cpus, probe_ms


class _Host:
    """Probe times in turn, and a clock that only sleeping advances."""

    def __init__(self, times):
        self.times, self.now, self.slept = list(times), 0.0, 0

    def probe(self, cpus):
        assert cpus == [0, 1]
        return self.times.pop(0)

    def sleep(self, seconds):
        self.now += seconds
        self.slept += 1


def _speed(tmp_path, times, name="speed.json"):
    host = _Host(times)
    return HostSpeed(tmp_path / name, host.probe, host.sleep, lambda: host.now), host


def test_slowness_is_a_probe_over_the_median_of_the_probes_before_it(tmp_path):
    speed, _ = _speed(tmp_path, [1.0, 1.1, 0.9, 1.0, 1.0, 1.6, 0.85])
    assert all(math.isnan(speed.slowness([0, 1])) for _ in range(MIN_HISTORY))  # nothing to judge by yet
    assert speed.slowness([0, 1]) == pytest.approx(1.6)
    assert speed.slowness([0, 1]) == pytest.approx(0.85)  # median of 1.0, 1.1, 0.9, 1.0, 1.0, 1.6
    again, _ = _speed(tmp_path, [2.0])  # another process on the same host: the history is in the file
    assert again.slowness([0, 1]) == pytest.approx(2.0)


def test_settle_waits_out_slow_and_fast_spells_but_not_forever(tmp_path):
    speed, host = _speed(tmp_path, [1.0] * MIN_HISTORY + [1.6, 0.8, 1.05])
    for _ in range(MIN_HISTORY):
        speed.slowness([0, 1])
    assert speed.settle([0, 1], max_wait_s=60) == pytest.approx(1.05) and host.slept == 2
    usual = 3 * MIN_HISTORY  # enough usual probes that five slow ones leave the median at 1.0
    stuck, host = _speed(tmp_path, [1.0] * usual + [1.7] * 5, "stuck.json")
    for _ in range(usual):
        stuck.slowness([0, 1])
    assert stuck.settle([0, 1], max_wait_s=3 * POLL_S) == pytest.approx(1.7) and host.slept == 3  # gave up
    assert stuck.settle([0, 1], max_wait_s=0) == pytest.approx(1.7) and host.slept == 3  # no wait: it only probes


def test_the_history_keeps_the_latest_probes_per_cpu_set(tmp_path):
    speed, _ = _speed(tmp_path, [1.0] * (HISTORY + 3))
    for _ in range(HISTORY + 3):
        speed.slowness([0, 1])
    assert {k: len(v) for k, v in json.loads((tmp_path / "speed.json").read_text()).items()} == {"0,1": HISTORY}


def test_the_probe_runs_a_thread_on_each_cpu_of_the_measurement():
    assert probe_cpus(3, (4, 5)) == [4, 5, 4] and probe_cpus(1, (7,)) == [7]
    assert math.isfinite(probe_ms(probe_cpus(2, None)))  # it ran on both CPUs and came back


def test_settle_s_is_a_measure_option_and_a_negative_one_is_refused(capsys):
    from opbench.cli import main

    assert main(["measure", "matmul:m=8,n=8,k=8", "--settle-s", "-1"]) == 2
    assert "--settle-s must be >= 0, got -1.0" in capsys.readouterr().err
