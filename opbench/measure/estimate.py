"""A trial's latency from its placements (docs/measurement.md#placements): the estimate and its interval.

A placement is one independent setting of a kernel in memory: a process forked for the run with its own
arguments and code mapping on this host, a fresh allocation on a GPU or a board. Its value is the median of
its repeats. Timing noise is a sum of delays (Chen & Revels), so the estimate is the fastest placement, taken
once two agree within ``agree`` and it is within twice ``agree`` of them. The interval runs from the estimate
over ``1 + h`` to the estimate times ``1 + h``: ``h`` is the second fastest placement's distance from it plus
:data:`INTERVAL_FLOOR` (what another process adds where the two are equal).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from opbench.measure.protocol import RunResult
from opbench.record import Status

INTERVAL_FLOOR = 0.02  # an interval's half-width where the two fastest placements are equal: what another
# process finds beyond them (fitted to benchmarks/reproducibility.py's re-measures: docs/measurement.md#interval)


@dataclass(frozen=True)
class Estimate:
    latency_s: float
    lo_s: float
    hi_s: float
    placements: int  # placements taken
    agreeing: int  # of them, those within ``agree`` of the fastest, it included (0: none agreed with it)


def placement_value(latencies_s: Sequence[float]) -> float:
    """One placement's latency: the median of its repeats (an interruption of one repeat does not move it)."""
    return statistics.median(latencies_s)


def estimate(values: Sequence[float], agree: float) -> Estimate:
    """The latency and its interval from the placements' values (at least one; a lone one's gap is ``agree``)."""
    if not values:
        raise ValueError("an estimate needs at least one placement")
    fastest, *others = sorted(values)
    gap = others[0] / fastest - 1 if others else agree
    spread = 1 + INTERVAL_FLOOR + gap
    agreeing = 1 + sum(v <= fastest * (1 + agree) for v in others)
    return Estimate(fastest, fastest / spread, fastest * spread, len(values), agreeing if agreeing > 1 else 0)


def wants_placement(values: Sequence[float], agree: float, least: int, most: int) -> bool:
    """Whether a trial whose placements gave ``values`` takes another: fewer than ``least`` so far, or fewer than
    ``most`` and none agree yet: two within ``agree`` of each other, the fastest placement within twice ``agree``
    of them (placements slowed alike by a slow host agree only with each other; a faster one apart from them
    asks for another)."""
    ordered = sorted(values)
    pair = next((low for low, high in zip(ordered, ordered[1:]) if high <= low * (1 + agree)), None)
    agreed = pair is not None and pair <= ordered[0] * (1 + 2 * agree)
    return len(values) < least or (len(values) < most and not agreed)


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
