"""Writes records to a slow store (MLflow) off the tuning loop's hot path."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from opbench.hardware.lock import HostLock
from opbench.tracking.row import Row

log = logging.getLogger("opbench")
HOLD_S = 5.0  # a write to a reachable store takes well under a second


class BackgroundWriter:
    """Calls ``write`` on each record, and other writes to the same store, in order, in a thread of its
    own, holding the host timing lock shared, as a build does: it never starts while a kernel is being
    timed and never holds up the next build. It holds the lock for at most ``hold_s``: a write to a
    store that is away (MLflow's client retries it for minutes) goes on without it rather than hold
    up every timed run on the host. A store that fails is logged, not raised: the JSON-lines log has
    the record and the engine has heard it."""

    def __init__(self, write: Callable[[Row], object], lock: HostLock, name: str = "record-writer",
                 hold_s: float = HOLD_S) -> None:
        self._write = write
        self._lock = lock
        self._hold_s = hold_s
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def put(self, record: Row) -> None:
        copy = dict(record)  # the caller goes on with its own
        self.call(lambda: self._write(copy), f"trial {copy.get('trial_id')}")

    def call(self, write: Callable[[], object], what: str = "a study's summary") -> None:
        """Run ``write`` after everything queued before it."""
        self._queue.put(lambda: _logged(write, what))

    def flush(self) -> None:
        """Return when every record put so far is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _drain(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if write is None:
                    return
                with self._lock.shared(at_most_s=self._hold_s):
                    write()
            finally:
                self._queue.task_done()


def _logged(write: Callable[[], object], what: str) -> None:
    try:
        write()
    except Exception:
        log.exception("could not record %s", what)
