"""The body of a worker process (``python -m opbench.measure.worker.main FD SETUP``): it answers
requests for its role until its parent closes the connection, or, as a zygote, forks workers that do."""
from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from opbench.measure.protocol import (
    BuildInput,
    BuildResult,
    CoRunGo,
    CoRunPrepare,
    CoRunResult,
    LibraryInput,
    ModelInput,
    ModelProfileInput,
    PeakInput,
    PrimFuncInput,
    RemoteConnect,
    RemoteSession,
    RunInput,
    RunResult,
)
from opbench.measure.worker._common import KERNEL, LIBRARY, READY, short_error
from opbench.measure.worker.kernel import KernelWorker
from opbench.measure.worker.library import LibraryWorker
from opbench.record import Status


def handlers_for(role: str, cores: tuple[int, ...] | None, threads: int) -> dict[type, Callable[[Any], Any]]:
    """What a worker of ``role`` does with each request type (made here: TVM is imported for a kernel worker)."""
    if role == LIBRARY:
        library = LibraryWorker(cores, threads)
        return {LibraryInput: library.library, ModelInput: library.model}
    worker = KernelWorker(cores, threads)
    return {BuildInput: worker.build, RunInput: worker.run, ModelInput: worker.model, PeakInput: worker.peak,
            PrimFuncInput: worker.primfunc, ModelProfileInput: worker.model_profile,
            CoRunPrepare: worker.corun_prepare, CoRunGo: worker.corun_go, RemoteConnect: worker.connect}


def _ready(conn: Connection, prepare: Callable[[], Any]) -> Any:
    """What ``prepare()`` made, once the parent is told this process is ready; None once it is told why the
    process could not start."""
    try:
        made = prepare()
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure to the parent
        conn.send(("error", short_error(exc)))
        return None
    conn.send((READY, os.getpid()))
    return made


def serve(conn: Connection, cores: tuple[int, ...] | None, threads: int, role: str = KERNEL) -> None:
    """Answer requests until the connection closes (the environment is already set)."""
    handlers = _ready(conn, lambda: handlers_for(role, cores, threads))
    if handlers is None:
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        kind = {BuildInput: BuildResult, CoRunPrepare: CoRunResult, CoRunGo: CoRunResult,
                RemoteConnect: RemoteSession}.get(type(request), RunResult)
        handler = handlers.get(type(request))
        if handler is None:
            conn.send(kind(Status.RUN_ERROR, f"a {role} worker does not take {type(request).__name__}"))
            continue
        try:
            result = handler(request)
        except Exception as exc:  # noqa: BLE001 - an unexpected error fails this request only
            status = Status.BUILD_ERROR if isinstance(request, BuildInput) else Status.RUN_ERROR
            result = kind(status, short_error(exc) + "\n" + traceback.format_exc(limit=3))
        conn.send(result)


def fork_workers(conn: Connection, cores: tuple[int, ...] | None, threads: int, role: str,
                 preload: tuple[str, ...]) -> None:
    """A zygote (docs/measurement.md#zygote): import what a worker of ``role`` needs, and ``preload``, then
    fork a worker per request (the descriptors of the socket it serves and of its log), answering its pid,
    and run nothing else, until the connection closes."""
    def imports() -> list[Any]:  # the handlers themselves are made in each worker
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its workers are reaped as they end
        return [handlers_for(role, cores, threads), *map(importlib.import_module, preload)]

    if _ready(conn, imports) is None:
        return
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        while True:
            message, fds, _, _ = socket.recv_fds(sock, 1, 2)
            if not message:
                return
            served, log = fds
            pid = os.fork()
            if pid == 0:  # the worker: it never returns
                try:
                    sock.close()
                    conn.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it waits for its runs' children
                    os.dup2(log, 2)
                    os.close(log)
                    serve(Connection(served), cores, threads, role)
                finally:
                    os._exit(0)
            os.close(served)
            os.close(log)
            conn.send(pid)


if __name__ == "__main__":
    from opbench.measure.worker.layout import fixed_layout
    from opbench.plugins import load_plugins

    fixed_layout()  # re-executes this process once, before any request

    load_plugins()  # the parent's OPBENCH_PLUGINS: operators it names can be built and run here
    cores, threads, role, preload = pickle.loads(bytes.fromhex(sys.argv[2]))
    if preload is None:
        serve(Connection(int(sys.argv[1])), cores, threads, role)
    else:
        fork_workers(Connection(int(sys.argv[1])), cores, threads, role, preload)
