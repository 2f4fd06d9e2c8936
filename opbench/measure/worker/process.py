"""A persistent worker process seen from the parent: call it with a timeout, survive its death."""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from typing import Any

from opbench.measure.worker._common import KERNEL, READY
from opbench.measure.worker.fork import describe_exit

START_TIMEOUT_S = 180.0  # importing TVM (and torch with it) on a busy 2-core box


class WorkerError(Exception):
    """The worker did not answer: it died (``timed_out`` False) or ran past its time limit."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Worker:
    """One child process (``python -m opbench.measure.worker.main``) that keeps TVM imported.

    A request that crashes or hangs the process costs only that request: the process is killed and
    a fresh one starts on the next call.
    """

    def __init__(self, env: dict[str, str] | None = None, cores: tuple[int, ...] | None = None, threads: int = 1,
                 role: str = KERNEL) -> None:
        self._env = dict(env or {})
        self._cores = cores
        self._threads = threads
        self.role = role
        self._proc: Any = None
        self._conn: Any = None
        # The worker's stderr (TVM's C++ warnings, crash messages) goes here, not to the terminal.
        self._log = tempfile.NamedTemporaryFile(prefix="opbench-worker-", suffix=".log", delete=False)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.alive:
            return
        parent, child = socket.socketpair()
        env = {**os.environ, **self._env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        setup = pickle.dumps((self._cores, self._threads, self.role)).hex()
        self._proc = subprocess.Popen(
            # the descriptor in fixed width: every worker's stack starts at the same address (docs/measurement.md#layout)
            [sys.executable, "-m", "opbench.measure.worker.main", f"{child.fileno():04d}", setup],
            pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL, stderr=self._log,
        )
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

    def _log_tail(self, lines: int = 3) -> str:
        try:
            with open(self._log.name, encoding="utf-8", errors="replace") as f:
                tail = [line.strip() for line in f.readlines()[-lines:] if line.strip()]
        except OSError:
            return ""
        return (": " + " | ".join(tail)) if tail else ""

    def _wait_exit(self) -> int | None:
        try:
            return self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        self.kill()
        self._log.close()
        os.unlink(self._log.name)
