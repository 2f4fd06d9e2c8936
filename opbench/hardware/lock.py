"""Host-wide lock that keeps timed runs exclusive across every OpBench process on the host, whoever runs it.

The lock file lives in the shared temporary folder so that every user's processes take turns on the
same cores. It is created by the first user with mode 0644 and opened read-only (``flock`` needs no
write access), never following a link and never with ``O_CREAT`` on a file another user made (the
kernel refuses that in sticky folders): another user can use it but neither replace nor redirect it.
Anyone who can open it can also hold it, so a wait is bounded and names the holder.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from opbench import settings
from opbench.exceptions import OpBenchError
from opbench.paths import open_nofollow

DEFAULT_LOCK = Path(tempfile.gettempdir()) / "opbench-timing.lock"
log = logging.getLogger("opbench")


class LockTimeout(OpBenchError):
    """The timing lock was held by another process for longer than a timed run can last."""

    exit_code = 1


class HostLock:
    """A file lock: timed runs take it exclusively, builds take it shared.

    So runs never overlap each other or a build, while builds run in parallel. A process that dies
    holding it releases it with its file descriptor.
    """

    def __init__(self, path: Path | str, wait_s: float | None = None) -> None:
        """``wait_s``: the longest wait for the lock (default :func:`opbench.settings.lock_wait_s`)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.wait_s = settings.lock_wait_s() if wait_s is None else wait_s

    def _open(self) -> int:
        while True:
            with contextlib.suppress(FileNotFoundError):
                return open_nofollow(self.path, os.O_RDONLY)
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile: open theirs
                fd = open_nofollow(self.path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.fchmod(fd, 0o644)  # whatever the umask: every user opens it
                return fd

    def _acquire(self, fd: int, mode: int) -> None:
        """``flock`` within :attr:`wait_s`, else :class:`LockTimeout` naming the holder."""
        deadline, delay, told = time.monotonic() + self.wait_s, 0.001, False
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise
            waited = time.monotonic() - (deadline - self.wait_s)
            if waited > 10 and not told:
                log.warning("waiting for the timing lock %s, held by %s", self.path, holders(self.path))
                told = True
            if time.monotonic() >= deadline:
                raise LockTimeout(f"the timing lock {self.path} was held by {holders(self.path)} for more than "
                                  f"{self.wait_s:g} s (OPBENCH_LOCK_WAIT_S); nothing is timed while another process holds it")
            time.sleep(delay)
            delay = min(2 * delay, 0.02)

    @contextlib.contextmanager
    def _hold(self, mode: int, at_most_s: float | None = None) -> Iterator[None]:
        fd = self._open()
        closed, guard = False, threading.Lock()

        def release() -> None:
            with guard:  # never on a closed descriptor, whose number may belong to another file by now
                if not closed:
                    fcntl.flock(fd, fcntl.LOCK_UN)

        timer = threading.Timer(at_most_s, release) if at_most_s is not None else None
        try:
            self._acquire(fd, mode)
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


def holders(path: Path) -> str:
    """Who holds ``path``'s flock, from ``/proc/locks``: "pid N (user U)", or "another process"."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "another process"
    pids = sorted({int(f[4]) for f in (line.split() for line in lines)
                   if len(f) > 5 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(inode) and f[4].isdigit()})
    return ", ".join(f"pid {pid} ({_owner(pid)})" for pid in pids) or "another process"


def _owner(pid: int) -> str:
    import pwd

    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        return f"user {pwd.getpwuid(uid).pw_name}"
    except (OSError, KeyError):
        return "user unknown"
