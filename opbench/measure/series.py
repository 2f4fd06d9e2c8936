"""The statistics a record keeps of its repeats, beside its estimate (:mod:`opbench.measure.estimate`)."""
from __future__ import annotations

import math
import statistics


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
