"""How one trial is timed, set in one place (docs/measurement.md).

A worker only times one series, as :meth:`TimingPolicy.series_shape` sizes it: one placement. How many
placements a job takes, and how they make its estimate, the runner decides by the same policy
(:mod:`opbench.measure.runner.placements`, :mod:`opbench.measure.estimate`), for every timed run: kernels,
library baselines, whole models, here, on RPC devices and GPUs.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opbench import settings

SERIES_BUDGET_S = 1.0  # a run longer than this takes fewer repeats and is never taken again (docs/measurement.md#budgets)
MIN_REPEATS = 3
WARM_CALL_S = 0.05  # a first call this long leaves nothing to warm up (docs/measurement.md#warm-up)


@dataclass(frozen=True)
class TimingPolicy:
    """Every setting of how a run is timed: the series a worker takes, and the placements the runner takes.

    A series (one placement) is ``repeat`` repeats of ``number`` calls, each repeat at least ``min_repeat_ms``
    (one call in the cold cache state, ``cache_flush``: every input but the activation evicted before each call,
    as inside a model; a library baseline's caches evicted). A
    job takes at least ``placements`` placements, and more, up to ``max_placements``, until its two fastest
    agree within ``agree`` (a fraction).
    """

    repeat: int = settings.REPEAT
    min_repeat_ms: float = field(default_factory=settings.min_repeat_ms)
    cache_flush: bool = False
    placements: int = field(default_factory=settings.placements)
    max_placements: int = field(default_factory=settings.max_placements)
    agree: float = settings.AGREE

    @property
    def cache_state(self) -> str:
        """What a record says of the caches its operator met: ``cold`` (``cache_flush``) or ``warm``."""
        return "cold" if self.cache_flush else "warm"

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

    def of_models(self) -> TimingPolicy:
        """How a whole model is timed, in every system alike: this policy, warm whatever its operators' cache state
        (a model runs run after run, as framework benchmarks time one: its previous run left the state it starts in)."""
        return dataclasses.replace(self, cache_flush=False)

    def exactly(self, placements: int | None) -> TimingPolicy:
        """This policy with ``placements`` placements, no more (a verification's rounds; None: as it is)."""
        if placements is None:
            return self
        return dataclasses.replace(self, placements=placements, max_placements=placements)

    def short(self) -> TimingPolicy:
        """One placement of :data:`MIN_REPEATS` repeats: a reference far slower than what it is compared with
        (docs/measurement.md#fresh)."""
        return dataclasses.replace(self, repeat=MIN_REPEATS, placements=1, max_placements=1)


def calls_per_repeat(min_repeat_ms: float, one_call_s: float) -> int:
    """Calls per timed repeat so that one repeat lasts at least ``min_repeat_ms``."""
    return max(1, math.ceil(min_repeat_ms / 1e3 / max(one_call_s, 1e-7)))
