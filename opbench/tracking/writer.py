"""Writes records to a slow store (MLflow) off the tuning loop's hot path."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from opbench.measure.lock import HostLock
from opbench.record import Record

log = logging.getLogger("opbench")


class BackgroundWriter:
    """Calls ``write`` on each record in a thread of its own, holding the host timing lock shared, as a
    build does: it never runs while a kernel is being timed and never holds up the next build. A store
    that fails is logged, not raised: the JSON-lines log has the record and the engine has heard it."""

    def __init__(self, write: Callable[[Record], object], lock: HostLock, name: str = "record-writer") -> None:
        self._write = write
        self._lock = lock
        self._queue: queue.Queue[Record | None] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def put(self, record: Record) -> None:
        self._queue.put(dict(record))  # a copy: the caller goes on with its own

    def flush(self) -> None:
        """Return when every record put so far is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _drain(self) -> None:
        while True:
            record = self._queue.get()
            try:
                if record is None:
                    return
                with self._lock.shared():
                    self._write(record)
            except Exception:
                log.exception("could not record trial %s", record and record.get("trial_id"))
            finally:
                self._queue.task_done()
