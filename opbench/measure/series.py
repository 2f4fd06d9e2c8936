"""The statistics a record keeps of a timed series."""
from __future__ import annotations

import math
import statistics


def latency_stats(latencies_s: list[float], turn_sizes: list[int] | None = None) -> dict[str, float]:
    """Median, mean and standard deviation of all the repeats (ms), and ``latency_cv``: the spread of the
    repeats within a series. For repeats taken in several turns (``turn_sizes``: each turn's count, in
    order) that is the pooled within-turn standard deviation over the mean, so the host's changes between
    turns, which ``latency_ms_std`` includes, do not count as the series' noise."""
    ms = [t * 1e3 for t in latencies_s]
    if not ms:
        return {}
    mean = statistics.fmean(ms)
    std = statistics.pstdev(ms)
    spread = std
    if turn_sizes and len(turn_sizes) > 1 and sum(turn_sizes) == len(ms) and len(ms) > len(turn_sizes):
        turns, start = [], 0
        for size in turn_sizes:
            turns.append(ms[start:start + size])
            start += size
        squares = sum((x - statistics.fmean(turn)) ** 2 for turn in turns for x in turn)
        spread = math.sqrt(squares / (len(ms) - len(turns)))
    return {"latency_ms": statistics.median(ms), "latency_ms_mean": mean, "latency_ms_std": std,
            "latency_cv": spread / mean if mean else math.nan}
