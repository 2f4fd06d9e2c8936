"""Worker processes seen from the parent: call one with a timeout, survive its death; fresh ones forked from a
zygote (docs/measurement.md#zygote)."""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection
from typing import IO, Any, Protocol

from opbench.measure.worker._common import KERNEL, READY
from opbench.measure.worker.fork import describe_exit

START_TIMEOUT_S = 180.0  # importing TVM (and torch with it) on a busy 2-core box


class WorkerError(Exception):
    """The worker did not answer: it died (``timed_out`` False) or ran past its time limit."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class _Process(Protocol):
    pid: int

    def running(self) -> bool: ...

    def exit_status(self, timeout: float) -> int | None:
        """Its exit code once it has ended (None: unknown, or still running after ``timeout`` seconds)."""

    def stop(self) -> None:
        """Kill it if it runs, and wait until it has ended."""


class _Spawned:
    """A worker this process started."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc, self.pid = proc, proc.pid

    def running(self) -> bool:
        return self._proc.poll() is None

    def exit_status(self, timeout: float) -> int | None:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.running():
            self._proc.kill()
        self._proc.wait()


class _Forked:
    """A worker a zygote forked: its end is seen through a pidfd; its exit status is the zygote's, never read."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.pidfd_open(pid)

    def _ended(self, timeout: float | None) -> bool:
        """Whether it has ended, waiting up to ``timeout`` seconds (None: until it does)."""
        waiting = select.poll()
        waiting.register(self._fd, select.POLLIN)  # a pidfd reads ready once its process has ended
        return bool(waiting.poll(None if timeout is None else timeout * 1e3))

    def running(self) -> bool:
        return not self._ended(0)

    def exit_status(self, timeout: float) -> int | None:
        self._ended(timeout)
        return None

    def stop(self) -> None:
        if self.running():
            signal.pidfd_send_signal(self._fd, signal.SIGKILL)
        self._ended(None)
        os.close(self._fd)


class Worker:
    """One child process (``python -m opbench.measure.worker.main``) that keeps TVM imported, or one forked
    from ``zygote``. With ``preload`` (modules to import) the process is a zygote: it runs nothing, and
    :meth:`fork` makes new workers of its role from it.

    A request that crashes or hangs the process costs only that request: the process is killed and
    a fresh one starts on the next call.
    """

    def __init__(self, env: dict[str, str] | None = None, cores: tuple[int, ...] | None = None, threads: int = 1,
                 role: str = KERNEL, zygote: Worker | None = None, preload: tuple[str, ...] | None = None) -> None:
        self._env = dict(env or {})
        self._cores = cores
        self._threads = threads
        self.role = role
        self._zygote, self._preload = zygote, preload
        self._forking = threading.Lock()  # a zygote forks one worker at a time
        self._proc: _Process | None = None
        self._conn: Any = None
        # The worker's stderr (TVM's C++ warnings, crash messages) goes here, not to the terminal: a file with no
        # name, so that nothing is left behind when this process is killed.
        self._log = tempfile.TemporaryFile(prefix="opbench-worker-", suffix=".log")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.running()

    def start(self) -> None:
        if self.alive:
            return
        parent, child = socket.socketpair()
        try:
            self._proc = self._zygote.fork(child, self._log) if self._zygote else self._spawn(child)
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        if not self._conn.poll(START_TIMEOUT_S):
            self.kill()
            raise WorkerError(f"worker did not start within {START_TIMEOUT_S:.0f} s", timed_out=True)
        try:
            kind, detail = self._conn.recv()
        except EOFError as exc:
            self.kill()
            raise WorkerError("worker died while starting", timed_out=False) from exc
        if kind != READY:
            self.kill()
            raise WorkerError(f"worker failed to start: {detail}", timed_out=False)

    def _spawn(self, end: socket.socket) -> _Spawned:
        env = {**os.environ, **self._env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        setup = pickle.dumps((self._cores, self._threads, self.role, self._preload)).hex()
        return _Spawned(subprocess.Popen(
            # the descriptor in fixed width: every worker's stack starts at the same address (docs/measurement.md#layout)
            [sys.executable, "-m", "opbench.measure.worker.main", f"{end.fileno():04d}", setup],
            pass_fds=(end.fileno(),), env=env, stdin=subprocess.DEVNULL, stderr=self._log,
        ))

    def fork(self, end: socket.socket, log: IO[bytes]) -> _Forked:
        """(A zygote's) a new worker of its role forked from it, serving ``end``, its stderr going to ``log``."""
        with self._forking:
            self.start()
            with socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
                socket.send_fds(sock, [b"w"], [end.fileno(), log.fileno()])
            return _Forked(self.result(START_TIMEOUT_S))

    def call(self, request: Any, timeout: float) -> Any:
        """Send ``request`` and wait up to ``timeout`` seconds for its result."""
        self.submit(request)
        return self.result(timeout)

    def submit(self, request: Any) -> None:
        """Send ``request`` without waiting (several workers then work at once); :meth:`result` collects it."""
        self.start()
        try:
            self._conn.send(request)
        except (BrokenPipeError, ConnectionResetError):
            self._died()

    def result(self, timeout: float) -> Any:
        """The answer to the last :meth:`submit`, waiting up to ``timeout`` seconds; kills the worker past it."""
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._died()
        self.kill()
        raise WorkerError(f"no answer within {timeout:.0f} s; worker killed", timed_out=True)

    def _died(self) -> None:
        code = self._wait_exit()
        self.kill()
        raise WorkerError(f"worker died ({describe_exit(code)}){self._log_tail()}", timed_out=False) from None

    def _log_tail(self, lines: int = 3, window: int = 8192) -> str:
        fd = self._log.fileno()
        end = os.fstat(fd).st_size
        text = os.pread(fd, window, max(0, end - window)).decode("utf-8", errors="replace")
        tail = [line.strip() for line in text.splitlines()[-lines:] if line.strip()]
        return (": " + " | ".join(tail)) if tail else ""

    def _wait_exit(self) -> int | None:
        return self._proc.exit_status(5) if self._proc is not None else None

    def kill(self) -> None:
        if self._proc is None:
            return
        self._proc.stop()
        self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        self.kill()
        self._log.close()
