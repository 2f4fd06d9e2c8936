"""The local runner: built kernels and library baselines, one at a time under the host lock, in worker processes."""
from __future__ import annotations

import contextlib
import math
import time
from concurrent.futures import ThreadPoolExecutor

from opbench import settings
from opbench.hardware.host_speed import HostSpeed, Slowness, probe_cpus
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.hardware.targets import is_gpu
from opbench.measure.protocol import EAGER, FRAMEWORKS, LibraryInput, ModelInput, RunInput, RunResult
from opbench.measure.runner._base import Runner
from opbench.measure.runner.retakes import SPELL, Attempt, joined, take, wants_more_turns
from opbench.measure.worker import KERNEL, LIBRARY, Worker, WorkerError
from opbench.measure.worker.zygotes import forked_worker, zygote_of
from opbench.record import Status
from opbench.workloads.models.sources import model_imports

Job = RunInput | LibraryInput | ModelInput


def _role(inp: Job) -> str:
    """Library baselines and models run by other frameworks run where TVM is never imported."""
    return LIBRARY if isinstance(inp, LibraryInput) or isinstance(inp, ModelInput) and inp.system in FRAMEWORKS else KERNEL


def _preload(inp: Job) -> tuple[str, ...]:
    """What the zygote of a fresh worker for ``inp`` imports beside its role's modules: torch where it runs,
    and what building a catalogue model for PyTorch eager imports."""
    if isinstance(inp, LibraryInput):
        return _library_preload(inp.library)
    if isinstance(inp, ModelInput) and inp.system in FRAMEWORKS:
        return _eager_preload(inp.model) if inp.system == EAGER else ("torch",)
    return ()


def _library_preload(library: str) -> tuple[str, ...]:
    return ("torch",) if library == "torch" else ()


def _eager_preload(model: str) -> tuple[str, ...]:
    """torch and the modules the model's build imports (a ``transformers`` model's took 3.7 s of each fresh process)."""
    return ("torch", *model_imports(model))


class LocalRunner(Runner[Job, RunResult]):
    """TVM's thread pool cannot grow once started, so each (threads, cores) gets its own kernel worker.

    Library baselines run in workers of their own that never import TVM: a process that ran a TVM
    kernel slows PyTorch down 10-150x. Workers start under the lock's shared side, so a start-up
    (importing TVM and torch) never overlaps a timed run, whichever process times it. With ``speed``,
    every CPU run is preceded by a probe of the host's speed, after waiting for the host's usual state (up
    to the job's ``settle_s``, or a share of :meth:`run_fresh`'s wait for a fresh-process turn), and
    followed by another; the job's :class:`~opbench.measure.timing.TimingPolicy` decides what is taken
    again and kept (:func:`opbench.measure.timing.take`).
    """

    def __init__(self, timeout_s: float = settings.RUN_TIMEOUT_S, lock: HostLock | None = None,
                 speed: HostSpeed | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._speed = speed
        self._workers: dict[tuple[str, int, tuple[int, ...] | None], Worker] = {}
        self._spell_outlasted_wait = False  # until a probe reads the usual state (docs/measurement.md#settle)

    @staticmethod
    def _new_worker(resources: Resources, role: str, preload: tuple[str, ...] = ()) -> Worker:
        return forked_worker(resources.worker_env(), resources.cores, resources.threads, role, preload)

    def _worker(self, resources: Resources, role: str) -> Worker:
        key = (role, resources.threads, resources.cores)
        if key not in self._workers:
            self._workers[key] = self._new_worker(resources, role)
        return self._workers[key]

    def _fresh_worker(self, inp: Job) -> Worker:
        """A new worker for ``inp``, forked from the zygote of its role, resources and preloads
        (docs/measurement.md#zygote)."""
        return self._new_worker(inp.resources, _role(inp), _preload(inp))

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

    def warm_up(self, resources: Resources | None = None, libraries: tuple[str, ...] = (),
                models: tuple[str, ...] = ()) -> None:
        """Start the kernel worker for ``resources`` now, so its start-up is not charged to a trial, and beside it
        the zygotes of the fresh processes that will time ``libraries`` and run ``models`` in PyTorch eager
        (their imports overlap on the cores)."""
        resources = resources or Resources()
        preloads = [*map(_library_preload, libraries), *map(_eager_preload, models)]
        zygotes = [zygote_of(resources.worker_env(), resources.cores, resources.threads, LIBRARY, preload)
                   for preload in preloads]
        self._start(self._worker(resources, KERNEL), *zygotes)

    def run(self, inp: Job) -> RunResult:
        return self._call(self._worker(inp.resources, _role(inp)), inp, inp.timing.settle_s)

    def run_turns(self, jobs: list[Job]) -> list[RunResult]:
        """Each job in its (persistent) worker, in turns taken as :meth:`run_fresh` takes them."""
        workers = [self._worker(inp.resources, _role(inp)) for inp in jobs]
        return self._take_turns(workers, jobs, max((inp.timing.settle_s for inp in jobs), default=0.0))

    def run_fresh(self, jobs: list[Job]) -> list[RunResult]:
        """Each job in a new process that has run nothing else (forked from a zygote); all start together,
        then take their turns (:meth:`_take_turns`), each waiting for the host's usual state as long as a
        spell rerun would, up to :func:`opbench.settings.fresh_settle_s` in all (docs/measurement.md#settle)."""
        workers = [self._fresh_worker(inp) for inp in jobs]
        turns = sum(inp.timing.turns for inp in jobs)
        try:
            self._start(*workers)
            wait_s = settings.spell_wait_s()
            return self._take_turns(workers, jobs, min(settings.fresh_settle_s(), turns * wait_s), wait_s)
        finally:
            for worker in workers:
                worker.close()

    def _take_turns(self, workers: list[Worker], jobs: list[Job], max_wait_s: float,
                    turn_wait_s: float = math.inf) -> list[RunResult]:
        """Jobs (``jobs[i]`` in ``workers[i]``) take their timing's ``turns`` turns, one series each, in an
        order that reverses every turn, and the jobs whose turns call for more (all in a spell, or disagreeing)
        take their timing's ``extra_turns`` more (:func:`~opbench.measure.runner.retakes.wants_more_turns`); a job's result joins its turns
        (:func:`joined`), so a slow spell of the host that covers a few seconds falls on every job's series
        alike instead of on one job's whole measurement. A job that fails takes no more turns. The turns
        wait ``max_wait_s`` at most in all for the host's usual state, each ``turn_wait_s`` at most
        (docs/measurement.md#settle)."""
        results: list[list[RunResult]] = [[] for _ in jobs]

        def take_turn(turn: int, who: list[int]) -> None:
            nonlocal max_wait_s
            for i in who if turn % 2 == 0 else reversed(who):
                if not results[i] or results[i][-1].status is Status.OK:
                    results[i].append(self._call(workers[i], jobs[i], min(max_wait_s, turn_wait_s)))
                    max_wait_s = max(0.0, max_wait_s - results[i][-1].host_wait_s)

        turns = max((inp.timing.turns for inp in jobs), default=0)
        for turn in range(turns):
            take_turn(turn, [i for i, inp in enumerate(jobs) if turn < inp.timing.turns])
        split = [i for i, inp in enumerate(jobs) if wants_more_turns(inp.timing, results[i])]
        for extra in range(max((jobs[i].timing.extra_turns for i in split), default=0)):
            take_turn(turns + extra, [i for i in split if extra < jobs[i].timing.extra_turns])
        return [joined(r) for r in results]

    def _call(self, worker: Worker, inp: Job, max_wait_s: float) -> RunResult:
        """One job's series in ``worker``, taken again as its timing policy says; the host probed around each."""
        def attempt(reason: str | None) -> Attempt:
            try:
                self._start(worker)
                with self._exclusive():
                    tick = time.perf_counter()
                    before = self._settle(inp.resources, inp.timing.spell_wait_s if reason == SPELL else max_wait_s)
                    if reason == SPELL and before is not None and not before.usual:
                        return Attempt(None, wait_s=time.perf_counter() - tick)  # a rerun would fall in the spell too
                    tock = time.perf_counter()
                    result = worker.call(inp, self.timeout_s)
                    tack = time.perf_counter()
                    after = self._settle(inp.resources, 0.0) if before is not None else None
            except WorkerError as exc:
                return Attempt(RunResult(Status.TIMEOUT if exc.timed_out else Status.RUN_ERROR, f"run: {exc}"))
            slowness = before.worse(after) if before is not None and after is not None else None
            return Attempt(result, slowness, (tock - tick) + (time.perf_counter() - tack))

        return take(inp.timing, attempt)

    def host_usual(self, resources: Resources) -> bool:
        """Whether the host is in its usual state for ``resources`` now, or within a spell rerun's wait
        (False when this runner does not probe)."""
        with self._exclusive():
            slowness = self._settle(resources, settings.spell_wait_s())
        return slowness is not None and slowness.usual

    def _settle(self, resources: Resources, max_wait_s: float) -> Slowness | None:
        """The host's slowness for ``resources`` (None: not probed, a GPU run), after waiting up to
        ``max_wait_s`` for its usual state; not waiting again, once a spell outlasted a wait, until a probe
        reads the usual state (docs/measurement.md#settle)."""
        if self._speed is None or is_gpu(resources.target):
            return None
        waits = max_wait_s > 0 and not self._spell_outlasted_wait
        slowness = self._speed.settle(probe_cpus(resources.threads, resources.cores), max_wait_s if waits else 0.0)
        self._spell_outlasted_wait = not slowness.usual and (waits or self._spell_outlasted_wait)
        return slowness

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()

