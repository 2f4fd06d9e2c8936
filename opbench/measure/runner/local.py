"""The local runner: built kernels and library baselines, one at a time under the host lock, in worker processes."""
from __future__ import annotations

import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

from opbench import settings
from opbench.hardware.host_speed import HostSpeed, Slowness, probe_cpus
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.hardware.targets import is_gpu
from opbench.measure.protocol import (
    EAGER,
    FRAMEWORKS,
    ONNXRUNTIME,
    TORCH_INT8,
    ZENTORCH,
    LibraryInput,
    ModelInput,
    ModelProfileInput,
    PeakInput,
    PrimFuncInput,
    RunInput,
    RunResult,
)
from opbench.measure.runner._base import Runner
from opbench.measure.runner.placements import place
from opbench.measure.worker import KERNEL, LIBRARY, Worker, WorkerError
from opbench.measure.worker.zygotes import forked_worker, zygote_of
from opbench.record import Status
from opbench.workloads.models.sources import model_imports

SETTLE_WAIT_S = 120.0  # placements wait for the host to settle until it has been unsettled this long (#probes)
SETTLE_POLL_S = 0.5  # ... probing again after this long, outside the lock
log = logging.getLogger("opbench")
Job = RunInput | LibraryInput | ModelInput | ModelProfileInput | PeakInput | PrimFuncInput


def _role(inp: Job) -> str:
    """Library baselines and models run by other frameworks run where TVM is never imported."""
    return LIBRARY if isinstance(inp, LibraryInput) or isinstance(inp, ModelInput) and inp.system in FRAMEWORKS else KERNEL


def _preload(inp: Job) -> tuple[str, ...]:
    """What the zygote of a fresh worker for ``inp`` imports beside its role's modules: torch where it runs,
    and what building a catalogue model for PyTorch eager imports."""
    if isinstance(inp, LibraryInput):
        return _library_preload(inp.library)
    if isinstance(inp, ModelInput) and inp.system in FRAMEWORKS:
        return _eager_preload(inp.model) if inp.system in (EAGER, ZENTORCH, TORCH_INT8) else ("torch",)
    return ()


def _library_preload(library: str) -> tuple[str, ...]:
    return {"torch": ("torch",), ONNXRUNTIME: ("onnxruntime", "onnx")}.get(library, ())


def _eager_preload(model: str) -> tuple[str, ...]:
    """torch and the modules the model's build imports (a ``transformers`` model's took 3.7 s of each fresh process)."""
    return ("torch", *model_imports(model))


class LocalRunner(Runner[Job, RunResult]):
    """TVM's thread pool cannot grow once started, so each (threads, cores) gets its own kernel worker.

    Library baselines run in workers of their own that never import TVM: a process that ran a TVM
    kernel slows PyTorch down 10-150x. Workers start under the lock's shared side, so a start-up
    (importing TVM and torch) never overlaps a timed run, whichever process times it. Every job takes its
    placements (:func:`~opbench.measure.runner.placements.place`): a child forked from its worker for each
    (:meth:`run`, :meth:`run_batch`), or a new process for each (:meth:`run_fresh`). With ``speed``, the host's
    speed is probed before every CPU placement, which waits while the host is unsettled (out of its usual state, or its
    cores sharing no cache), and the record keeps the furthest from usual.
    """

    def __init__(self, timeout_s: float = settings.RUN_TIMEOUT_S, lock: HostLock | None = None,
                 speed: HostSpeed | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._speed = speed
        self._workers: dict[tuple[str, int, tuple[int, ...] | None], Worker] = {}
        self._said_busy_at = -math.inf  # when placements last said they wait for the host to settle

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
        return self.run_batch([inp])[0]

    def run_batch(self, jobs: list[Job]) -> list[RunResult]:
        """Each job's placements in its (persistent) worker, interleaved with the others'."""
        workers = [self._worker(inp.resources, _role(inp)) for inp in jobs]
        return place(jobs, lambda i: self._call(workers[i], jobs[i]))

    def run_fresh(self, jobs: list[Job]) -> list[RunResult]:
        """Each placement of each job in a new process that has run nothing else (forked from a zygote),
        interleaved with the others' (docs/measurement.md#fresh)."""
        def in_new_process(i: int) -> RunResult:
            worker = self._fresh_worker(jobs[i])
            try:
                return self._call(worker, jobs[i])
            finally:
                worker.close()

        return place(jobs, in_new_process)

    def _call(self, worker: Worker, inp: Job) -> RunResult:
        """One placement of a job in ``worker`` (a CPU kernel's in a child forked for it), under the host
        lock, the host probed just before it; while the probe finds the host unsettled, for at most
        :data:`SETTLE_WAIT_S` since it last was settled, it probes again after :data:`SETTLE_POLL_S` without the lock
        (a job of one placement, a quick estimate, takes the host as it finds it)."""
        try:
            self._start(worker)
            tick = time.perf_counter()
            while True:
                with self._exclusive():
                    slowness = self._probe(inp.resources)
                    probed_s = time.perf_counter() - tick
                    if not self._waits_to_settle(slowness, inp):
                        result = worker.call(inp, self.timeout_s)
                        break
                self._say_busy(slowness)
                time.sleep(SETTLE_POLL_S)
        except WorkerError as exc:
            return RunResult(Status.TIMEOUT if exc.timed_out else Status.RUN_ERROR, f"run: {exc}")
        if slowness is not None:
            result.load.update(slowness.as_load())
        result.host_wait_s = probed_s
        return result

    def _say_busy(self, slowness: Slowness | None) -> None:
        """Say why placements wait (a long wait is no silent hang), at most once every :data:`SETTLE_WAIT_S`."""
        if slowness is not None and time.monotonic() - self._said_busy_at >= SETTLE_WAIT_S:
            self._said_busy_at = time.monotonic()
            log.info("the host is busy (%s): placements wait for it to settle, for up to %.0f s",
                     slowness.unsettled_by(), SETTLE_WAIT_S)

    def host_usual(self, resources: Resources) -> bool:
        """Whether a probe finds the host in its usual state for ``resources`` now (False when this runner
        does not probe)."""
        with self._exclusive():
            slowness = self._probe(resources)
        return slowness is not None and slowness.usual

    def _waits_to_settle(self, slowness: Slowness | None, inp: Job) -> bool:
        """Whether ``inp`` (of several placements) waits: the probe found the host unsettled, for less than
        :data:`SETTLE_WAIT_S` so far."""
        if slowness is None or slowness.settled or inp.timing.max_placements == 1:
            return False
        assert self._speed is not None
        return self._speed.unsettled_s(probe_cpus(inp.resources.threads, inp.resources.cores)) < SETTLE_WAIT_S

    def _probe(self, resources: Resources) -> Slowness | None:
        """The host's slowness for ``resources`` now (None: not probed, a GPU run)."""
        if self._speed is None or is_gpu(resources.target):
            return None
        return self._speed.slowness(probe_cpus(resources.threads, resources.cores))

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()

