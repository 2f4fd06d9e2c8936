"""Every local worker forked from a zygote: one per kind of worker in this process, kept until it exits, so
that a process pays for importing TVM (or torch) once, however many measurers, builders and fresh
processes it starts (docs/measurement.md#zygote)."""
from __future__ import annotations

import atexit
import threading

from opbench.hardware.resources import Resources
from opbench.measure.worker._common import KERNEL
from opbench.measure.worker.process import Worker

_Kind = tuple[str, tuple[tuple[str, str], ...], tuple[int, ...] | None, int, tuple[str, ...]]
_zygotes: dict[_Kind, Worker] = {}
_lock = threading.Lock()


def forked_worker(env: dict[str, str] | None = None, cores: tuple[int, ...] | None = None, threads: int = 1,
                  role: str = KERNEL, preload: tuple[str, ...] = ()) -> Worker:
    """A new worker (started on its first call) forked from this process's zygote of the same environment,
    cores, threads, role and ``preload``; the zygote starts with the first worker of its kind."""
    return Worker(env, cores, threads, role, zygote=zygote_of(env, cores, threads, role, preload))


def zygote_of(env: dict[str, str] | None = None, cores: tuple[int, ...] | None = None, threads: int = 1,
              role: str = KERNEL, preload: tuple[str, ...] = ()) -> Worker:
    """This process's zygote of that kind (started by its first fork, or by starting it)."""
    kind = (role, tuple(sorted((env or {}).items())), cores, threads, preload)
    with _lock:
        if kind not in _zygotes:
            _zygotes[kind] = Worker(env, cores, threads, role, preload=preload)
        return _zygotes[kind]


def one_thread_worker() -> Worker:
    """A kernel worker that times nothing itself (a builder, an RPC client), forked from the zygote of 1-thread runs."""
    one = Resources(threads=1)
    return forked_worker(one.worker_env(), one.cores, one.threads)


@atexit.register
def close_zygotes() -> None:
    """End this process's zygotes (the workers they forked end with their own handles)."""
    with _lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()
