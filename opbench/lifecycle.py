"""How OpBench's processes end: SIGTERM closes them as an exception would (so what is queued is written),
and tests kill a process at a chosen point (``$OPBENCH_FAULT``) instead of sleeping and hoping."""
from __future__ import annotations

import collections
import os
import signal

FAULT_ENV = "OPBENCH_FAULT"  # "POINT:SIGNAL[:N]": send SIGNAL to this process the Nth time it reaches POINT
_reached: collections.Counter[str] = collections.Counter()


def exit_on_sigterm() -> None:
    """SIGTERM (``kill``, ``nnictl stop``, systemd) raises SystemExit(143) in the main thread: every
    ``with`` block unwinds, so recorders write what they hold before the process ends."""
    signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def fault_point(point: str) -> None:
    """A place a test may kill this process at; nothing unless ``$OPBENCH_FAULT`` names ``point``."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or spec.split(":")[0] != point:
        return
    _, name, *nth = spec.split(":")
    _reached[point] += 1
    if _reached[point] == int(nth[0] if nth else 1):
        os.kill(os.getpid(), getattr(signal, name))
