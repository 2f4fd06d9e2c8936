"""What the runner decides of a job's timed runs, by its :class:`~opbench.measure.timing.TimingPolicy`: whether a
series is taken again (:func:`retake`), which attempt is kept (:func:`take`), whether a job takes more turns
(:func:`wants_more_turns`) and how its turns are joined (:func:`joined`)."""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from opbench.hardware.host_speed import SLOWNESS_COLUMNS, Slowness, furthest_from_usual
from opbench.measure.protocol import RunResult
from opbench.measure.timing import SERIES_BUDGET_S, TimingPolicy, cv
from opbench.record import Status

NOISY, SPELL = "noisy", "spell"  # why a series is taken again: its repeats varied, or a probe found a spell


def wants_more_turns(policy: TimingPolicy, turns: list[RunResult]) -> bool:
    """Whether a job's turns call for ``extra_turns`` more: a probe found every one of them in a spell, or
    the medians of those it found in the usual state differ by more than its ``max_cv``, so the host changed
    between them unseen by the probes (docs/measurement.md#extra-turns); never for a failed job, a
    lone turn or a series past :data:`SERIES_BUDGET_S`."""
    if len(turns) < 2 or any(t.status is not Status.OK or t.run_s > SERIES_BUDGET_S for t in turns):
        return False
    usual = [t for t in turns if Slowness.of(t.load).usual]
    if not usual:
        return True
    medians = [statistics.median(t.latencies_s) for t in usual if t.latencies_s]
    return len(medians) > 1 and max(medians) > (1 + policy.max_cv) * min(medians)


def retake(policy: TimingPolicy, attempt: Attempt, spells: int, noisy: int) -> str | None:
    """Why ``attempt`` is taken again (:data:`SPELL`, :data:`NOISY`), given the retakes so far, or None."""
    result = attempt.result
    if result is None or result.status is not Status.OK or result.run_s > SERIES_BUDGET_S:
        return None
    if attempt.slowness is not None and not attempt.slowness.usual and spells < policy.spell_reruns:
        return SPELL
    if cv(result.latencies_s) > policy.max_cv and noisy < policy.max_remeasures:
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
    :func:`retake` says so; the attempt of lowest :meth:`Attempt.rank` is kept, with its
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
        if (reason := retake(policy, got, spells, noisy)) is None:
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
