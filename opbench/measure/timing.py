"""How one trial is timed, decided in one place (docs/measurement.md, "One trial, in five sentences").

A worker only times one series as :meth:`TimingPolicy.series_shape` sizes it; whether a series is taken
again, which attempt is kept (:func:`take`) and how a job's turns are joined (:func:`joined`) are decided
here, in the runner's process, for every timed run: kernels, library baselines and fresh processes.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opbench import settings
from opbench.hardware.host_speed import SLOWNESS_COLUMNS, Slowness, furthest_from_usual
from opbench.record import Status

if TYPE_CHECKING:
    from opbench.measure.protocol import RunResult

SERIES_BUDGET_S = 1.0  # a run longer than this takes fewer repeats and is never taken again (docs/measurement.md#budgets)
MIN_REPEATS = 3
WARM_CALL_S = 0.05  # a first call this long leaves nothing to warm up (docs/measurement.md#warm-up)
NOISY, SPELL = "noisy", "spell"  # why a series is taken again: its repeats varied, or a probe found a spell


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

    def wants_more_turns(self, turns: list[RunResult]) -> bool:
        """Whether a job's turns call for ``extra_turns`` more: a probe found every one of them in a spell, or
        the medians of those it found in the usual state differ by more than ``max_cv``, so the host changed
        between them unseen by the probes (docs/measurement.md#extra-turns); never for a failed job, a
        lone turn or a series past :data:`SERIES_BUDGET_S`."""
        if len(turns) < 2 or any(t.status is not Status.OK or t.run_s > SERIES_BUDGET_S for t in turns):
            return False
        usual = [t for t in turns if Slowness.of(t.load).usual]
        if not usual:
            return True
        medians = [statistics.median(t.latencies_s) for t in usual if t.latencies_s]
        return len(medians) > 1 and max(medians) > (1 + self.max_cv) * min(medians)

    def retake(self, attempt: Attempt, spells: int, noisy: int) -> str | None:
        """Why ``attempt`` is taken again (:data:`SPELL`, :data:`NOISY`), given the retakes so far, or None."""
        result = attempt.result
        if result is None or result.status is not Status.OK or result.run_s > SERIES_BUDGET_S:
            return None
        if attempt.slowness is not None and not attempt.slowness.usual and spells < self.spell_reruns:
            return SPELL
        if cv(result.latencies_s) > self.max_cv and noisy < self.max_remeasures:
            return NOISY
        return None


@dataclass
class Attempt:
    """One timed run (None: not taken, the host stayed in a spell past the wait) and the host's slowness its
    probes found (None: not probed, e.g. a GPU run)."""

    result: RunResult | None
    slowness: Slowness | None = None
    wait_s: float = 0.0  # spent probing and waiting for the host's usual state

    def rank(self) -> tuple[float, float]:
        """Lower is kept: the distance from the host's usual state (0 within it), then the spread."""
        off = self.slowness.deviation if self.slowness is not None and not self.slowness.usual else 0.0
        return off, cv(self.result.latencies_s) if self.result is not None else math.inf


def take(policy: TimingPolicy, attempt: Callable[[str | None], Attempt]) -> RunResult:
    """A job's result: ``attempt(reason)`` times it (reason None the first time; a retake not taken because
    the host stayed in a spell past its wait ends the retakes), taken again while
    :meth:`TimingPolicy.retake` says so; the attempt of lowest :meth:`Attempt.rank` is kept, with its
    slowness in its load, the retakes counted, and every attempt's run and wait time. A failed first
    attempt is returned as it is; a failed retake leaves the attempt kept so far."""
    kept: Attempt | None = None
    spells = noisy = 0
    run_s = wait_s = 0.0
    reason: str | None = None
    while True:
        got = attempt(reason)
        wait_s += got.wait_s
        if got.result is None:
            break
        if got.result.status is not Status.OK:
            if kept is None:
                return got.result
            break
        spells, noisy = spells + (reason == SPELL), noisy + (reason == NOISY)
        run_s += got.result.run_s
        if kept is None or got.rank() < kept.rank():
            kept = got
        if (reason := policy.retake(got, spells, noisy)) is None:
            break
    assert kept is not None and kept.result is not None
    result = kept.result
    if kept.slowness is not None:
        result.load.update(kept.slowness.as_load())
    result.spell_reruns, result.remeasures, result.run_s, result.host_wait_s = spells, noisy, run_s, wait_s
    return result


def joined(turns: list[RunResult]) -> RunResult:
    """One result from a job's turns: the latencies of the turns whose probes found the host in its usual
    state (all of them when none did; ``turns_left_out`` counts the others), every turn's run and wait
    times, and, of the turns kept, the largest share of the cores other processes kept busy and the
    host's slowness furthest from its usual state; the first failure when one failed. A probe, not a
    latency, decides which turns count, so a lucky turn is never preferred to an unlucky one."""
    failed = next((t for t in turns if t.status is not Status.OK), None)
    if failed is not None or len(turns) == 1:
        return failed or turns[0]
    kept = _usual(turns)
    first = kept[0]
    load = dict(first.load)
    worst_of: dict[str, Callable[..., float]] = {"other_busy_frac": max, **dict.fromkeys(SLOWNESS_COLUMNS, furthest_from_usual)}
    for key, worst in worst_of.items():
        if key in load:
            load[key] = worst([v for t in kept if (v := t.load.get(key, math.nan)) == v], default=math.nan)
    return dataclasses.replace(first, latencies_s=[s for t in kept for s in t.latencies_s],
                               turn_sizes=[len(t.latencies_s) for t in kept], turns_left_out=len(turns) - len(kept),
                               run_s=sum(t.run_s for t in turns), remeasures=sum(t.remeasures for t in turns),
                               spell_reruns=sum(t.spell_reruns for t in turns),
                               host_wait_s=sum(t.host_wait_s for t in turns), load=load)


def _usual(turns: list[RunResult]) -> list[RunResult]:
    """The turns whose probes found the host in its usual state; all of them when none did."""
    return [t for t in turns if Slowness.of(t.load).usual] or turns


def cv(latencies: list[float]) -> float:
    """The spread of a series: standard deviation over mean (0 for fewer than two repeats)."""
    mean = statistics.fmean(latencies) if latencies else 0.0
    return statistics.pstdev(latencies) / mean if mean > 0 and len(latencies) > 1 else 0.0


def calls_per_repeat(min_repeat_ms: float, one_call_s: float) -> int:
    """Calls per timed repeat so that one repeat lasts at least ``min_repeat_ms``."""
    return max(1, math.ceil(min_repeat_ms / 1e3 / max(one_call_s, 1e-7)))
