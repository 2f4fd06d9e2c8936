"""The co-run runner: co-run members in worker processes of their own, released together at one barrier
(see :mod:`opbench.measure.corun` for what a co-run measures)."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from opbench import settings
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.measure.protocol import CoRunGo, CoRunPrepare, CoRunResult
from opbench.measure.runner._base import Runner
from opbench.measure.worker import Worker, WorkerError
from opbench.measure.worker.zygotes import forked_worker
from opbench.record import Status

BARRIER_LEAD_S = 0.05  # from releasing the members to their common start
SAMPLE_MS = 2.0  # full: one timed sample repeats a kernel until it lasts this long; stream: one call each


@dataclass(frozen=True)
class CoRunInput:
    """Built members, each (resources, artifact, workload spec), run together in ``mode`` for ``window_s``."""

    kernels: tuple[tuple[Resources, str, str], ...]
    mode: str = "full"
    window_s: float = 1.0
    solo: bool = True  # also time each member alone first


@dataclass
class CoRunOutcome:
    solo: list[CoRunResult] | None  # one per member, None unless asked for
    together: list[CoRunResult]  # one per worker: per member when full, one for all when stream (empty: not run)


Group = tuple[Resources, list[tuple[str, str]]]  # one worker's resources and its (artifact, workload spec)s


class CoRunner(Runner[CoRunInput, CoRunOutcome]):
    """Worker processes for co-run members, one per member slot (two members never share a process)."""

    def __init__(self, timeout_s: float = settings.RUN_TIMEOUT_S, lock: HostLock | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._workers: dict[tuple[int, tuple[int, ...] | None, int], Worker] = {}

    def _worker(self, resources: Resources, slot: int) -> Worker:
        key = (resources.threads, resources.cores, slot)
        if key not in self._workers:
            self._workers[key] = forked_worker(resources.worker_env(), resources.cores, resources.threads)
        return self._workers[key]

    def _all(self, workers: list[Worker], requests: Sequence[object], timeout: float) -> list[CoRunResult]:
        """Send every request first, then collect: the workers work at the same time."""
        results: list[CoRunResult | None] = [None] * len(workers)
        for i, (worker, request) in enumerate(zip(workers, requests)):
            try:
                worker.submit(request)
            except WorkerError as exc:
                results[i] = CoRunResult(Status.RUN_ERROR, f"co-run: {exc}")
        for i, worker in enumerate(workers):
            if results[i] is None:
                try:
                    results[i] = worker.result(timeout)
                except WorkerError as exc:
                    results[i] = CoRunResult(Status.TIMEOUT if exc.timed_out else Status.RUN_ERROR, f"co-run: {exc}")
        return [r for r in results if r is not None]

    def _session(self, groups: list[Group], window_s: float, sample_ms: float) -> list[CoRunResult]:
        workers = [self._worker(res, slot) for slot, (res, _) in enumerate(groups)]
        prepares = [CoRunPrepare(tuple(a for a, _ in kernels), tuple(w for _, w in kernels), sample_ms)
                    for _, kernels in groups]
        ready = self._all(workers, prepares, self.timeout_s)
        if any(r.status is not Status.OK for r in ready):
            return ready
        start = time.monotonic() + BARRIER_LEAD_S
        return self._all(workers, [CoRunGo(start, start + window_s)] * len(workers), window_s + self.timeout_s)

    def run(self, inp: CoRunInput) -> CoRunOutcome:
        """Each member alone (one result per member; None unless ``solo``), then together (one result
        per worker: per member when ``full``, a single one holding every member when ``stream``)."""
        kernels, window_s = inp.kernels, inp.window_s
        if inp.mode == "full":
            together: list[Group] = [(res, [(artifact, spec)]) for res, artifact, spec in kernels]
        else:
            together = [(kernels[0][0], [(artifact, spec) for _, artifact, spec in kernels])]
        sample_ms = SAMPLE_MS if inp.mode == "full" else 0.0  # stream: calls interleave one by one, A B A B ...

        def run() -> CoRunOutcome:
            alone = [self._session([(res, [(artifact, spec)])], window_s, sample_ms)[0]
                     for res, artifact, spec in kernels] if inp.solo else None
            if alone and any(r.status is not Status.OK for r in alone):
                return CoRunOutcome(alone, [])  # a member that fails alone would fail (or hang) together too
            return CoRunOutcome(alone, self._session(together, window_s, sample_ms))

        if self._lock is None:
            return run()
        with self._lock.exclusive():
            return run()

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
