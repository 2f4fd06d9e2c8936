"""A trial's side of the service: find the service of this user and store (starting it when there is
none, or only a stale socket), send the trial, get its record. Imports no TVM, torch or MLflow."""
from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opbench.integration.nni.service.address import authkey, open_private, socket_path
from opbench.integration.nni.service.protocol import ServiceClosing, ServiceManager, TrialReply, TrialRequest

START_TIMEOUT_S = 180.0  # the service imports TVM and starts its workers before it listens
CLOSE_TIMEOUT_S = 120.0  # a service that is exiting writes what it queued first; a trial waits this long for it
LOST = (EOFError, ConnectionError, BrokenPipeError, OSError)  # what a dead service looks like to a proxy


class ServiceError(RuntimeError):
    """The measurement service could not be started, or died while it held a trial."""


ServiceManager.register("service")


@contextlib.contextmanager
def _starting(socket: Path) -> Iterator[None]:
    """One client at a time may (re)start the service of ``socket``."""
    with os.fdopen(open_private(socket.with_suffix(".lock"), "w"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _connect(socket: Path) -> Any:
    manager = ServiceManager(address=str(socket), authkey=authkey(socket))
    manager.connect()
    return manager.service()  # type: ignore[attr-defined]  # registered above


def _start(socket: Path, idle_timeout_s: float) -> Any:
    log = socket.with_suffix(".log")
    with os.fdopen(open_private(log, "a"), "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "opbench.integration.nni.service", str(socket), "--idle-timeout", str(idle_timeout_s)],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(f"the measurement service exited at start ({process.returncode}); see {log}")
        with contextlib.suppress(*LOST):
            return _connect(socket)
        time.sleep(0.1)
    process.kill()
    raise ServiceError(f"the measurement service did not listen on {socket} within {START_TIMEOUT_S:.0f} s; see {log}")


def service(tracking_uri: str | None, idle_timeout_s: float) -> Any:
    """A proxy of the running service for ``tracking_uri``, started afresh when there is none."""
    socket = socket_path(tracking_uri)
    with contextlib.suppress(*LOST):
        return _connect(socket)
    with _starting(socket):
        with contextlib.suppress(*LOST):  # another client started it meanwhile
            return _connect(socket)
        socket.unlink(missing_ok=True)  # a stale socket: its service is gone
        return _start(socket, idle_timeout_s)


def measure(request: TrialRequest, idle_timeout_s: float, timings: dict[str, float] | None = None) -> TrialReply:
    """Measure and record one trial in the service (the next one, when it found one exiting idle); ServiceError
    names it if it dies meanwhile. ``timings`` gets the time (epoch s) at which the service answered first
    (``connected``)."""
    socket = socket_path(request.tracking_uri)
    while (reply := _measure_in(service(request.tracking_uri, idle_timeout_s), request, socket, timings)) is None:
        # The refused call's exception and its frame hold each other, and the proxy: collected, the proxy closes
        # this thread's cached connection to the socket, which the next service will listen on.
        gc.collect()
        _wait_until_gone(socket)
    return reply


def _measure_in(proxy: Any, request: TrialRequest, socket: Path, timings: dict[str, float] | None) -> TrialReply | None:
    """The trial measured by the service behind ``proxy``; None when that service is exiting or went before it was
    asked anything (it removed its socket on its idle exit between being found and its first call: nothing measured)."""
    pid: int | str = "unknown"
    try:
        pid = proxy.ping()
        if timings is not None:
            timings["connected"] = time.time()
        return proxy.measure(request)
    except ServiceClosing:
        return None
    except LOST as exc:
        if pid == "unknown" and not socket.exists():
            return None
        raise ServiceError(f"the measurement service (pid {pid}, {socket}) died during the trial "
                           f"({type(exc).__name__}); the next trial starts a fresh one") from exc


def _wait_until_gone(socket: Path) -> None:
    """Wait for a service that is exiting to remove its socket, :data:`CLOSE_TIMEOUT_S` at most."""
    deadline = time.monotonic() + CLOSE_TIMEOUT_S
    while socket.exists():
        if time.monotonic() > deadline:
            raise ServiceError(f"the measurement service on {socket} began to exit {CLOSE_TIMEOUT_S:.0f} s ago "
                               f"and is still there; see {socket.with_suffix('.log')}")
        time.sleep(0.1)
