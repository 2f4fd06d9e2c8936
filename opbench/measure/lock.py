"""Host-wide lock that keeps timed runs exclusive across every OpBench process on the host."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LOCK = Path(tempfile.gettempdir()) / "opbench-timing.lock"


class HostLock:
    """A file lock: timed runs take it exclusively, builds take it shared.

    So runs never overlap each other or a build, while builds run in parallel. A process that dies
    holding it releases it with its file descriptor.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _hold(self, mode: int, at_most_s: float | None = None) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        closed, guard = False, threading.Lock()

        def release() -> None:
            with guard:  # never on a closed descriptor, whose number may belong to another file by now
                if not closed:
                    fcntl.flock(fd, fcntl.LOCK_UN)

        timer = threading.Timer(at_most_s, release) if at_most_s is not None else None
        try:
            fcntl.flock(fd, mode)
            if timer is not None:
                timer.daemon = True
                timer.start()
            yield
        finally:
            if timer is not None:
                timer.cancel()
            with guard:
                closed = True
                os.close(fd)

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._hold(fcntl.LOCK_EX)

    def shared(self, at_most_s: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Held shared; with ``at_most_s``, released after that long even if the body goes on (then
        without it), so a body that waits on something outside the host cannot hold up timed runs."""
        return self._hold(fcntl.LOCK_SH, at_most_s)
