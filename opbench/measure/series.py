"""What a run adds to its trial's record: its estimate (:mod:`opbench.measure.estimate`) and the statistics of
its repeats."""
from __future__ import annotations

import math
import statistics

from opbench.measure.estimate import estimate, placement_values, split
from opbench.measure.protocol import RunResult
from opbench.measure.timing import TimingPolicy
from opbench.record import Status, TrialRecord


def add_run(record: TrialRecord, run: RunResult, timing: TimingPolicy, gflop: float, peak_gflops: float | None) -> None:
    """Set on ``record`` what ``run`` (timed by ``timing``) measured: its estimate, interval and placements, its
    repeats and how they were taken, its throughput (and share of ``peak_gflops``, where there is one)."""
    record.run_s, record.device_addr = run.run_s, run.device_addr or None
    if run.max_abs_err == run.max_abs_err:
        record.max_abs_err = run.max_abs_err
    if run.status is not Status.OK:
        return
    values = placement_values(run.latencies_s, run.placement_sizes)
    est = estimate(values, timing.agree)
    record.set(**latency_stats(split(run.latencies_s, run.placement_sizes)), **run.load)
    record.latency_ms, record.latency_lo_ms, record.latency_hi_ms = est.latency_s * 1e3, est.lo_s * 1e3, est.hi_s * 1e3
    record.placements, record.placements_agreeing = est.placements, est.agreeing
    record.placement_ms = [v * 1e3 for v in values]
    record.gflops = gflop / est.latency_s
    record.peak_frac = record.gflops / peak_gflops if peak_gflops else None
    record.number, record.repeat, record.latencies_ms = run.number, len(run.latencies_s), [t * 1e3 for t in run.latencies_s]
    record.energy_j, record.power_w = run.energy_j, run.power_w
    record.host_wait_s = run.host_wait_s
    record.cache_flush, record.worker_pid = int(timing.cache_flush), run.pid
    record.kernel_pid = run.kernel_pid or None


def latency_stats(placements: list[list[float]]) -> dict[str, float]:
    """Median, mean and standard deviation of all the repeats (ms: the median is one placement's estimate), and
    ``latency_cv``: the spread of the repeats
    within a placement, pooled over placements (the differences between placements, which ``latency_ms_std``
    includes, are the interval's business)."""
    ms = [[t * 1e3 for t in p] for p in placements if p]
    every = [t for p in ms for t in p]
    if not every:
        return {}
    mean = statistics.fmean(every)
    squares = sum((t - statistics.fmean(p)) ** 2 for p in ms for t in p)
    free = len(every) - len(ms)
    spread = math.sqrt(squares / free) if free > 0 else 0.0
    return {"latency_ms": statistics.median(every), "latency_ms_mean": mean, "latency_ms_std": statistics.pstdev(every),
            "latency_cv": spread / mean if mean else math.nan}
