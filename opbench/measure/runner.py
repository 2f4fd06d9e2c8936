"""Runs built kernels one at a time under the host lock, in a worker per resource setting."""
from __future__ import annotations

from opbench.measure.lock import HostLock
from opbench.measure.types import LibraryInput, RunInput, RunResult, Status
from opbench.measure.worker import Worker, WorkerError
from opbench.resources import Resources


class LocalRunner:
    """TVM's thread pool cannot grow once started, so each (threads, cores) gets its own worker."""

    def __init__(self, timeout_s: float = 120.0, lock: HostLock | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._workers: dict[tuple[int, tuple[int, ...] | None], Worker] = {}

    def _worker(self, resources: Resources) -> Worker:
        key = (resources.threads, resources.cores)
        if key not in self._workers:
            self._workers[key] = Worker(resources.worker_env(), resources.cores, resources.threads)
        return self._workers[key]

    def warm_up(self, resources: Resources) -> None:
        """Start the worker for ``resources`` now, so its start-up is not charged to a trial."""
        self._worker(resources).start()

    def run(self, inp: RunInput | LibraryInput, resources: Resources) -> RunResult:
        worker = self._worker(resources)
        worker.start()
        try:
            if self._lock is None:
                return worker.call(inp, self.timeout_s)
            with self._lock.exclusive():
                return worker.call(inp, self.timeout_s)
        except WorkerError as exc:
            return RunResult(Status.TIMEOUT if exc.timed_out else Status.RUN_ERROR, f"run: {exc}")

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
