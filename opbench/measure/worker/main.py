"""The body of a worker process (``python -m opbench.measure.worker.main FD SETUP``): it answers
requests for its role until its parent closes the connection."""
from __future__ import annotations

import os
import pickle
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
    RemoteConnect,
    RemoteSession,
    RunInput,
    RunResult,
)
from opbench.measure.worker._common import KERNEL, LIBRARY, READY, short_error
from opbench.measure.worker.kernel import KernelWorker
from opbench.measure.worker.library import LibraryWorker
from opbench.record import Status


def serve(conn: Connection, cores: tuple[int, ...] | None, threads: int, role: str = KERNEL) -> None:
    """Answer requests until the connection closes (the environment is already set)."""
    try:
        if role == LIBRARY:
            library = LibraryWorker(cores, threads)
            handlers: dict[type, Callable[[Any], Any]] = {LibraryInput: library.library, ModelInput: library.model}
        else:
            worker = KernelWorker(cores, threads)
            handlers = {BuildInput: worker.build, RunInput: worker.run, ModelInput: worker.model,
                        CoRunPrepare: worker.corun_prepare, CoRunGo: worker.corun_go, RemoteConnect: worker.connect}
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure to the parent
        conn.send(("error", short_error(exc)))
        return
    conn.send((READY, os.getpid()))
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


if __name__ == "__main__":
    import pickle

    from opbench.measure.worker.layout import fixed_layout
    from opbench.plugins import load_plugins

    fixed_layout()  # re-executes this process once, before any request

    load_plugins()  # the parent's OPBENCH_PLUGINS: operators it names can be built and run here
    serve(Connection(int(sys.argv[1])), *pickle.loads(bytes.fromhex(sys.argv[2])))
