"""Builds trials in persistent worker processes, several in parallel, each with a timeout."""
from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

from opbench import settings
from opbench.hardware.lock import HostLock
from opbench.measure.protocol import BuildInput, BuildResult
from opbench.measure.worker import Worker, WorkerError
from opbench.measure.worker.zygotes import one_thread_worker
from opbench.record import Status


class LocalBuilder:
    def __init__(self, workers: int = 1, timeout_s: float = settings.BUILD_TIMEOUT_S, lock: HostLock | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._all = [one_thread_worker() for _ in range(max(1, workers))]
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        for worker in self._all:
            self._idle.put(worker)
        self._pool = ThreadPoolExecutor(max_workers=len(self._all), thread_name_prefix="opbench-build")

    def _build_one(self, inp: BuildInput) -> BuildResult:
        worker = self._idle.get()
        try:
            return worker.call(inp, self.timeout_s)
        except WorkerError as exc:
            return BuildResult(Status.TIMEOUT if exc.timed_out else Status.BUILD_ERROR, f"build: {exc}")
        finally:
            self._idle.put(worker)

    def build(self, inputs: list[BuildInput]) -> list[BuildResult]:
        """Build every input; the results keep the inputs' order. Never raises for a bad trial."""
        if not inputs:
            return []
        if self._lock is None:
            return list(self._pool.map(self._build_one, inputs))
        with self._lock.shared():
            return list(self._pool.map(self._build_one, inputs))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for worker in self._all:
            worker.close()
