"""A run in a child forked from the worker, and how a process's end is told."""
from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import traceback
from collections.abc import Callable

from opbench.measure.protocol import RunResult
from opbench.measure.worker._common import short_error
from opbench.record import Status

PR_SET_PDEATHSIG = 1  # prctl(2)


def in_child(run: Callable[[], RunResult]) -> RunResult:
    """``run()`` in a child forked from this process, its result sent back through a pipe; this process
    stays as it was (docs/measurement.md#fork). A child that dies fails its run only."""
    parent = os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it never returns
        code = 1
        try:
            os.close(read)
            _die_with(parent)
            try:
                result = run()
            except Exception as exc:  # noqa: BLE001 - this run's error
                result = RunResult(Status.RUN_ERROR, short_error(exc) + "\n" + traceback.format_exc(limit=3))
            with os.fdopen(write, "wb") as out:
                out.write(pickle.dumps(result))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        data = answer.read()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        return RunResult(Status.RUN_ERROR, f"the kernel's process died ({describe_exit(code)})")
    answered: RunResult = pickle.loads(data)
    answered.kernel_pid = pid
    return answered


def _die_with(parent: int) -> None:
    """Have this child killed when its worker dies (the parent kills a worker whose run hangs)."""
    with contextlib.suppress(AttributeError, OSError):  # prctl: Linux only
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before that
        os._exit(1)


def describe_exit(exitcode: int | None) -> str:
    """A process's exit code (negative: the signal that killed it) in words."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


