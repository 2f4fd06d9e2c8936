"""Host-wide lock that keeps timed runs exclusive across every OpBench process on the host."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
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
    def _hold(self, mode: int) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._hold(fcntl.LOCK_EX)

    def shared(self) -> contextlib.AbstractContextManager[None]:
        return self._hold(fcntl.LOCK_SH)
