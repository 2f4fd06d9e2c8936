"""A trial's latency from its placements (docs/measurement.md#placements): the estimate and its interval.

A placement is one independent setting of a kernel in memory: a process forked for the run with its own
arguments and code mapping on this host, a fresh allocation on a GPU or a board. Its value is the median of
its repeats. Timing noise mostly adds delay, so the estimate is the median of the fastest placements that
agree within ``agree`` (the fast mode); the interval spans them, up to the median of all placements where that
is slower (their host changed while they were taken, and another process may find it so), widened by
``agree`` / 2 each way. Placements that never agree give the median of all, with an interval from the fastest
to the slowest.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from opbench.measure.protocol import RunResult
from opbench.record import Status


@dataclass(frozen=True)
class Estimate:
    latency_s: float
    lo_s: float
    hi_s: float
    placements: int  # placements taken
    agreeing: int  # of them, those of the fast mode the estimate is the median of (0: they never agreed)


def placement_value(latencies_s: Sequence[float]) -> float:
    """One placement's latency: the median of its repeats (an interruption of one repeat does not move it)."""
    return statistics.median(latencies_s)


def fast_mode(values: Sequence[float], agree: float, needed: int = 2) -> list[float]:
    """The fastest group of at least ``needed`` placements that agree: those within ``agree`` (a fraction) of
    the fastest value that has ``needed - 1`` others within it, ascending; empty when no such group exists
    (a lone faster value, a fast spell of the host, is left out)."""
    ordered = sorted(values)
    for start, low in enumerate(ordered):
        group = [v for v in ordered[start:] if v <= low * (1 + agree)]
        if len(group) >= needed:
            return group
    return []


def estimate(values: Sequence[float], agree: float) -> Estimate:
    """The latency and its interval from the placements' values (at least one)."""
    if not values:
        raise ValueError("an estimate needs at least one placement")
    mode = fast_mode(values, agree)
    kept = mode or sorted(values)
    margin = agree / 2
    high = max(kept[-1], statistics.median(values))  # placements slower than the mode witnessed a host that changes
    return Estimate(statistics.median(kept), kept[0] * (1 - margin), high * (1 + margin), len(values), len(mode))


def settled(values: Sequence[float], agree: float) -> bool:
    """Whether two placements agree within ``agree`` and the fastest is not faster than them by more than twice
    ``agree``: placements slowed alike (up to 2x at a low spread while a shared host's vCPU is slow) agree with
    each other, and the fast one alone may be the kernel's speed."""
    mode = fast_mode(values, agree)
    return bool(mode) and min(values) * (1 + 2 * agree) >= mode[0]


def wants_placement(values: Sequence[float], agree: float, least: int, most: int) -> bool:
    """Whether a trial whose placements gave ``values`` takes another: fewer than ``least`` so far, or fewer than
    ``most`` and not :func:`settled` yet."""
    return len(values) < least or (len(values) < most and not settled(values, agree))


def estimated_ms(run: RunResult, agree: float) -> float:
    """A run's estimate over its placements, ms (NaN when it failed)."""
    if run.status is not Status.OK or not run.latencies_s:
        return math.nan
    return estimate(placement_values(run.latencies_s, run.placement_sizes), agree).latency_s * 1e3


def placement_values(latencies_s: Sequence[float], sizes: Sequence[int], scale: float = 1.0) -> list[float]:
    """Each placement's value (times ``scale``: 1e3 for ms), in the order they were taken."""
    return [placement_value(p) * scale for p in split(latencies_s, sizes)]


def split(latencies_s: Sequence[float], sizes: Sequence[int]) -> list[list[float]]:
    """A run's repeats cut into its placements' (``sizes``: each placement's count, in order; all one
    placement without sizes)."""
    if not sizes:
        return [list(latencies_s)]
    out, start = [], 0
    for size in sizes:
        out.append(list(latencies_s[start:start + size]))
        start += size
    return out
