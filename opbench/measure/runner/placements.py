"""How a runner takes a job's placements (docs/measurement.md#placements), the same on this host, RPC devices
and GPUs: a batch's jobs take one placement each per round, in a random order, until each has the placements
its :class:`~opbench.measure.timing.TimingPolicy` asks for (:func:`~opbench.measure.estimate.wants_placement`);
its placements join into one result."""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol

from opbench.hardware.host_speed import SLOWNESS_COLUMNS, furthest_from_usual
from opbench.measure.estimate import placement_value, wants_placement
from opbench.measure.protocol import RunResult
from opbench.measure.timing import TimingPolicy
from opbench.record import Status


class Timed(Protocol):
    @property
    def timing(self) -> TimingPolicy: ...


def place(jobs: Sequence[Timed], call: Callable[[int], RunResult], rng: random.Random | None = None) -> list[RunResult]:
    """Each job's placements (``call(i)`` takes one of ``jobs[i]``), a round at a time, each round's jobs in a
    random order, so a spell of the host or a slow process falls on several jobs' placements alike; a job
    stops at its first failure. One joined result per job."""
    rng = rng or random.Random()
    taken: list[list[RunResult]] = [[] for _ in jobs]
    while todo := [i for i, got in enumerate(taken) if _wants(jobs[i].timing, got)]:
        rng.shuffle(todo)
        for i in todo:
            taken[i].append(call(i))
    return [joined(got) for got in taken]


def _wants(timing: TimingPolicy, got: list[RunResult]) -> bool:
    if got and got[-1].status is not Status.OK:
        return False
    return wants_placement([placement_value(r.latencies_s) for r in got], timing.agree, timing.placements,
                           timing.max_placements)


def joined(placements: list[RunResult]) -> RunResult:
    """One result from a job's placements: all their repeats (``placement_sizes`` cuts them), every one's run
    and wait times, each profiled operator's median, the largest share of the cores other processes kept busy
    and the host's slowness furthest from its usual state; the failure when one failed."""
    failed = next((p for p in placements if p.status is not Status.OK), None)
    if failed is not None or len(placements) == 1:
        return failed or placements[0]
    first = placements[0]
    load = dict(first.load)
    worst_of: dict[str, Callable[..., float]] = {"other_busy_frac": max, **dict.fromkeys(SLOWNESS_COLUMNS, furthest_from_usual)}
    for key, worst in worst_of.items():
        if key in load:
            load[key] = worst([v for p in placements if (v := p.load.get(key, math.nan)) == v], default=math.nan)
    op_ms = {name: statistics.median(p.op_ms[name] for p in placements if name in p.op_ms)
             for name in {name for p in placements for name in p.op_ms}}
    return dataclasses.replace(first, latencies_s=[s for p in placements for s in p.latencies_s], op_ms=op_ms,
                               placement_sizes=[len(p.latencies_s) for p in placements],
                               run_s=sum(p.run_s for p in placements),
                               host_wait_s=sum(p.host_wait_s for p in placements), load=load)
