"""How one trial is timed, set in one place (docs/measurement.md, "One trial, in five sentences").

A worker only times one series as :meth:`TimingPolicy.series_shape` sizes it; whether a series is taken
again, which attempt is kept and how a job's turns are joined follow the same policy in the runner's process
(:mod:`opbench.measure.runner.retakes`), for every timed run: kernels, library baselines and fresh processes.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opbench import settings

SERIES_BUDGET_S = 1.0  # a run longer than this takes fewer repeats and is never taken again (docs/measurement.md#budgets)
MIN_REPEATS = 3
WARM_CALL_S = 0.05  # a first call this long leaves nothing to warm up (docs/measurement.md#warm-up)


@dataclass(frozen=True)
class TimingPolicy:
    """Every setting of how a run is timed: the series a worker takes, and when the runner takes it again.

    A series is ``repeat`` repeats of ``number`` calls, each repeat at least ``min_repeat_ms`` (one call with
    ``cache_flush``). An attempt is taken again when a host-speed probe found the host outside its usual
    state (at most ``spell_reruns`` times, each once the host is back within ``spell_wait_s``) or its
    repeats vary more than ``max_cv`` (at most ``max_remeasures`` times); a trial waits up to
    ``settle_s`` for the usual state first; a batch's trials share their repeats in ``turns`` turns.
    """

    repeat: int = settings.REPEAT
    min_repeat_ms: float = field(default_factory=settings.min_repeat_ms)
    cache_flush: bool = False
    max_cv: float = settings.MAX_CV
    max_remeasures: int = settings.MAX_REMEASURES
    spell_reruns: int = field(default_factory=settings.spell_reruns)
    spell_wait_s: float = field(default_factory=settings.spell_wait_s)
    settle_s: float = field(default_factory=settings.settle_s)
    turns: int = settings.TURNS
    extra_turns: int = field(default_factory=settings.extra_turns)

    def series_shape(self, first_s: float, call: Callable[[], object]) -> tuple[int, int]:
        """Calls per timed repeat (``number``) and repeats of a series of ``call``, whose first call took
        ``first_s``: a first call shorter than a repeat is followed by a warm one, which sizes the series
        (docs/measurement.md#series)."""
        one_call_s = first_s
        if not self.cache_flush and first_s < self.min_repeat_ms / 1e3:
            tick = time.perf_counter()
            call()
            one_call_s = min(first_s, time.perf_counter() - tick)
        number = 1 if self.cache_flush else calls_per_repeat(self.min_repeat_ms, one_call_s)
        return number, self.repeats(number * one_call_s)

    def repeats(self, repeat_s: float) -> int:
        """Timed repeats of a series whose repeats last ``repeat_s``: ``repeat``, fewer (down to
        :data:`MIN_REPEATS`) where they would take longer than :data:`SERIES_BUDGET_S`."""
        fit = math.floor(SERIES_BUDGET_S / max(repeat_s, 1e-9))
        return min(self.repeat, max(MIN_REPEATS, fit))

    @staticmethod
    def warmup_repeats(first_s: float) -> int:
        """Repeats timed and dropped before the series: one (cold caches, a pool waking up), none after a
        first call of :data:`WARM_CALL_S` or more, which warmed everything up."""
        return 0 if first_s >= WARM_CALL_S else 1

    def per_turn(self) -> TimingPolicy:
        """The series of one of ``turns`` turns: the repeats shared among them."""
        return dataclasses.replace(self, repeat=math.ceil(self.repeat / self.turns))

    def fresh(self, short: bool = False) -> TimingPolicy:
        """A fresh-process measurement's: :data:`~opbench.settings.FRESH_TURNS` turns of a series never taken
        again, for its spread or for a spell (its turns are the repeats, and :func:`joined` leaves out a turn
        found in a spell); one turn of :data:`MIN_REPEATS` calls when ``short`` (a reference far slower than
        what it is compared with, docs/measurement.md#fresh)."""
        return dataclasses.replace(self, max_remeasures=0, spell_reruns=0, repeat=MIN_REPEATS if short else self.repeat,
                                   turns=1 if short else settings.FRESH_TURNS)


def cv(latencies: list[float]) -> float:
    """The spread of a series: standard deviation over mean (0 for fewer than two repeats)."""
    mean = statistics.fmean(latencies) if latencies else 0.0
    return statistics.pstdev(latencies) / mean if mean > 0 and len(latencies) > 1 else 0.0


def calls_per_repeat(min_repeat_ms: float, one_call_s: float) -> int:
    """Calls per timed repeat so that one repeat lasts at least ``min_repeat_ms``."""
    return max(1, math.ceil(min_repeat_ms / 1e3 / max(one_call_s, 1e-7)))
