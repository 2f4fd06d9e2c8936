"""How OpBench's processes end: SIGTERM closes them as an exception would (so what is queued is written),
and tests kill a process at a chosen point (``$OPBENCH_FAULT``) instead of sleeping and hoping."""
from __future__ import annotations

import collections
import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator

# "POINT:SIGNAL[:N[:TARGET]]": the Nth time a process reaches POINT, send SIGNAL to TARGET: itself ("self",
# the default), its parent ("parent", while the one it started under lives) or its process group ("group")
FAULT_ENV = "OPBENCH_FAULT"
FAULT_ONCE_ENV = "OPBENCH_FAULT_ONCE"  # a path: the fault fires in the first process to create it, in no other
_reached: collections.Counter[str] = collections.Counter()
_PARENT = os.getppid()


def exit_on_sigterm() -> None:
    """SIGTERM (``kill``, ``nnictl stop``, systemd) raises SystemExit(143) in the main thread: every
    ``with`` block unwinds, so recorders write what they hold before the process ends."""
    signal.signal(signal.SIGTERM, _terminate)


def skip_final_collection() -> None:
    """Leave what the process has built up (MLflow's, SQLAlchemy's and TVM's modules) out of the garbage
    collections of the interpreter's teardown, which took ~1 s of each ``opbench`` command; every atexit
    handler, ``with`` block and file still closes as before."""
    gc.freeze()


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie, killed and not yet reaped by its parent, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def end_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent (``parent_pid``) dies, even by SIGKILL: a killed ``tune``
    takes its worker processes with it (Linux)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # it died before the call
        raise SystemExit(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """A SIGTERM that arrives inside the block takes effect when it ends (in the main thread, where Python
    runs signal handlers): for steps that leave shared state half-written if cut short, such as a trial
    asked but not yet claimed."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is None:
        yield  # only the main thread sets handlers, and one set outside Python cannot be put back
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if pending and callable(previous):
            previous(signal.SIGTERM, None)
        elif pending and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def fault_point(point: str) -> None:
    """A place a test may kill this process at; nothing unless ``$OPBENCH_FAULT`` names ``point``."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or spec.split(":")[0] != point:
        return
    _, name, *rest = spec.split(":")
    nth, target = (rest + ["1", "self"][len(rest):])[:2]
    _reached[point] += 1
    if _reached[point] != int(nth) or not _first_to_fire():
        return
    sig = getattr(signal, name)
    if target == "group":
        os.killpg(os.getpgrp(), sig)
    elif target == "parent":
        if os.getppid() == _PARENT:  # not a reaper that adopted this process after its parent died
            os.kill(_PARENT, sig)
    else:
        os.kill(os.getpid(), sig)


def _first_to_fire() -> bool:
    once = os.environ.get(FAULT_ONCE_ENV)
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True
