"""The local runner: built kernels and library baselines, one at a time under the host lock, in worker processes."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from opbench import settings
from opbench.hardware.host_speed import (
    SLOWNESS_COLUMNS,
    SPELL_RERUN_MAX_S,
    HostSpeed,
    Slowness,
    furthest_from_usual,
    probe_cpus,
)
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.hardware.targets import is_gpu
from opbench.measure.protocol import LibraryInput, RunInput, RunResult
from opbench.measure.runner._base import Runner
from opbench.measure.worker import KERNEL, LIBRARY, Worker, WorkerError
from opbench.record import Status

Job = RunInput | LibraryInput


def _role(inp: Job) -> str:
    return LIBRARY if isinstance(inp, LibraryInput) else KERNEL


class LocalRunner(Runner[RunInput | LibraryInput, RunResult]):
    """TVM's thread pool cannot grow once started, so each (threads, cores) gets its own kernel worker.

    Library baselines run in workers of their own that never import TVM: a process that ran a TVM
    kernel slows PyTorch down 10-150x. Workers start under the lock's shared side, so a start-up
    (importing TVM and torch) never overlaps a timed run, whichever process times it. With ``speed``,
    every CPU run is preceded by a probe of the host's speed, after waiting for the host's usual state (up
    to ``settle_s`` for a run, up to :func:`opbench.settings.fresh_settle_s` for a fresh-process turn), and followed by
    another; a run either probe found outside the usual state that took at most :data:`SPELL_RERUN_MAX_S`
    is taken again, at most ``spell_reruns`` times and each once the host is back in its usual state
    within ``spell_wait_s`` (a spell that outlasts the wait ends the reruns), and the attempt nearest the
    usual state is kept, its probes' slowness in the result's load and every attempt's run time in its
    ``run_s``.
    """

    def __init__(self, timeout_s: float = settings.RUN_TIMEOUT_S, lock: HostLock | None = None,
                 speed: HostSpeed | None = None, settle_s: float = 0.0, spell_reruns: int | None = None,
                 spell_wait_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._speed = speed
        self.settle_s = settle_s
        self.spell_reruns = settings.spell_reruns() if spell_reruns is None else spell_reruns
        self.spell_wait_s = settings.spell_wait_s() if spell_wait_s is None else spell_wait_s
        self._workers: dict[tuple[str, int, tuple[int, ...] | None], Worker] = {}

    @staticmethod
    def _new_worker(resources: Resources, role: str) -> Worker:
        return Worker(resources.worker_env(), resources.cores, resources.threads, role)

    def _worker(self, resources: Resources, role: str) -> Worker:
        key = (role, resources.threads, resources.cores)
        if key not in self._workers:
            self._workers[key] = self._new_worker(resources, role)
        return self._workers[key]

    def _shared(self) -> contextlib.AbstractContextManager[None]:
        return self._lock.shared() if self._lock else contextlib.nullcontext()

    def _exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._lock.exclusive() if self._lock else contextlib.nullcontext()

    def _start(self, *workers: Worker) -> None:
        """Start the workers not running yet, together, outside any timed run."""
        todo = [w for w in workers if not w.alive]
        if not todo:
            return
        with self._shared():
            if len(todo) == 1:
                todo[0].start()
                return
            with ThreadPoolExecutor(len(todo)) as pool:
                for future in [pool.submit(w.start) for w in todo]:
                    with contextlib.suppress(WorkerError):  # reported by the run that needs it
                        future.result()

    def warm_up(self, resources: Resources | None = None) -> None:
        """Start the kernel worker for ``resources`` now, so its start-up is not charged to a trial."""
        self._start(self._worker(resources or Resources(), KERNEL))

    def run(self, inp: Job) -> RunResult:
        return self._call(self._worker(inp.resources, _role(inp)), inp, self.settle_s)

    def run_turns(self, jobs: list[Job], turns: int) -> list[RunResult]:
        """Each job in its (persistent) worker, in ``turns`` turns taken as :meth:`run_fresh` takes them."""
        return self._take_turns([self._worker(inp.resources, _role(inp)) for inp in jobs], jobs, turns, self.settle_s)

    def run_fresh(self, jobs: list[Job], turns: int = 1) -> list[RunResult]:
        """Each job in a new process that has run nothing else; all start together, then take ``turns``
        turns (:meth:`_take_turns`)."""
        workers = [self._new_worker(inp.resources, _role(inp)) for inp in jobs]
        try:
            self._start(*workers)
            return self._take_turns(workers, jobs, turns, settings.fresh_settle_s())
        finally:
            for worker in workers:
                worker.close()

    def _take_turns(self, workers: list[Worker], jobs: list[Job], turns: int, max_wait_s: float) -> list[RunResult]:
        """Jobs (``jobs[i]`` in ``workers[i]``) take ``turns`` turns, one series of the job's timing each, in
        an order that reverses every turn; a job's result joins its turns (:func:`joined`), so a slow spell
        of the host that covers a few seconds falls on every job's series alike instead of on one job's
        whole measurement. A job that fails takes no more turns."""
        results: list[list[RunResult]] = [[] for _ in jobs]
        for turn in range(turns):
            order = range(len(jobs)) if turn % 2 == 0 else reversed(range(len(jobs)))
            for i in order:
                if not results[i] or results[i][-1].status is Status.OK:
                    results[i].append(self._call(workers[i], jobs[i], max_wait_s))
        return [joined(r) for r in results]

    def _call(self, worker: Worker, inp: Job, max_wait_s: float) -> RunResult:
        kept: tuple[RunResult, Slowness] | None = None
        attempts, run_s, wait_s = 0, 0.0, 0.0
        while True:
            try:
                self._start(worker)
                with self._exclusive():
                    tick = time.perf_counter()
                    before = self._settle(inp.resources, max_wait_s if kept is None else max(max_wait_s, self.spell_wait_s))
                    if kept is not None and before is not None and not before.usual:
                        wait_s += time.perf_counter() - tick
                        break  # the spell outlasted the wait: a rerun now would fall in it too
                    tock = time.perf_counter()
                    result = worker.call(inp, self.timeout_s)
                    tack = time.perf_counter()
                    after = self._settle(inp.resources, 0.0) if before is not None else None
                    wait_s += (tock - tick) + (time.perf_counter() - tack)
            except WorkerError as exc:
                return RunResult(Status.TIMEOUT if exc.timed_out else Status.RUN_ERROR, f"run: {exc}")
            if before is None or after is None or result.status is not Status.OK:
                return result  # not probed (a GPU run, no HostSpeed), or failed: nothing to take again
            attempts += 1
            run_s += result.run_s
            slowness = before.worse(after)
            if kept is None or slowness.deviation < kept[1].deviation:
                kept = (result, slowness)
            if slowness.usual or result.run_s > SPELL_RERUN_MAX_S or attempts > self.spell_reruns:
                break
        assert kept is not None
        result, slowness = kept
        result.load.update(slowness.as_load())
        result.spell_reruns, result.run_s, result.host_wait_s = attempts - 1, run_s, wait_s
        return result

    def _settle(self, resources: Resources, max_wait_s: float) -> Slowness | None:
        """The host's slowness for ``resources`` (None: not probed, a GPU run), after waiting up to
        ``max_wait_s`` for its usual state."""
        if self._speed is None or is_gpu(resources.target):
            return None
        return self._speed.settle(probe_cpus(resources.threads, resources.cores), max_wait_s)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


def joined(turns: list[RunResult]) -> RunResult:
    """One result from a job's turns: the latencies of the turns whose probes found the host in its usual
    state (all of them when none did; ``turns_left_out`` counts the others), every turn's run and wait
    times, and, of the turns kept, the largest share of the cores other processes kept busy and the
    host's slowness furthest from its usual state; the first failure when one failed. A probe, not a
    latency, decides which turns count, so a lucky turn is never preferred to an unlucky one."""
    failed = next((t for t in turns if t.status is not Status.OK), None)
    if failed is not None or len(turns) == 1:
        return failed or turns[0]
    kept = [t for t in turns if Slowness.of(t.load).usual] or turns
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
