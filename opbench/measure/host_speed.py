"""How fast the host runs our threads right now: a probe, its normal time, and waiting out spells.

This 2-vCPU host has spells of a fraction of a second to tens of seconds in which ``threads`` threads at
once run 1.2-2x slower (and rarer ones ~15% faster), while each CPU alone runs at its usual speed. The
probe runs a small single-threaded matrix product on each of the measurement's cores at once and takes
the slowest thread's median. Sampled alternately with torch's 2-thread matmul-512, it tracked it with
Pearson 0.94 over 895 samples, as a torch 2-thread 256x256 product did over 1050 (0.17/0.205/0.25/0.33
ms against 1.33/1.58/1.93/2.48 ms in the host's four states). Its normal time is the
median of the last :data:`HISTORY` probes on this host (kept in a file, as most probes find the host in
its usual state); ``slowness`` is a probe's time over it.
"""
from __future__ import annotations

import functools
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOST_SPEED_FILE = "opbench-host-speed.json"  # beside the timing lock: one per host
PROBE_SIZE = 128  # square float32 matrices: 4 MFLOP a call, in cache on any CPU
PROBE_CALLS = 20
HISTORY = 200  # probes whose median is the normal time
MIN_HISTORY = 5  # probes taken before the first one is judged
TOLERANCE = 0.10  # a probe within this of its normal time finds the host in its usual state
# The longest a trial waits for the usual state: 0 by default, as 2 s took resnet50-c5's 64 trials from
# 67 to 39 a minute (framework overhead 5.5% -> 8.7%) in a phase when the host switched states often.
SETTLE_S = float(os.environ.get("OPBENCH_SETTLE_S", "0"))
FRESH_SETTLE_S = float(os.environ.get("OPBENCH_FRESH_SETTLE_S", "10"))  # ... and a fresh-process turn
POLL_S = 0.5


def probe_ms(cpus: list[int], calls: int = PROBE_CALLS) -> float:
    """The slowest of ``len(cpus)`` threads, one pinned to each CPU, all running at once: its median time
    (ms) of one single-threaded ``PROBE_SIZE``-square matrix product."""
    a = _probe_matrix()
    medians: list[float] = [0.0] * len(cpus)
    start = threading.Barrier(len(cpus))

    def run(i: int) -> None:
        os.sched_setaffinity(0, {cpus[i]})  # this thread only
        times = []
        start.wait()
        for _ in range(calls):
            tick = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - tick)
        medians[i] = statistics.median(times) * 1e3

    with _blas().limit(limits=1, user_api="blas"):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cpus))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return max(medians)


@functools.cache
def _probe_matrix() -> Any:
    import numpy as np

    return np.random.default_rng(0).random((PROBE_SIZE, PROBE_SIZE), dtype=np.float32)


@functools.cache
def _blas() -> Any:
    """numpy's BLAS, found once (threadpoolctl inspects the loaded libraries)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def probe_cpus(threads: int, cores: tuple[int, ...] | None) -> list[int]:
    """The CPUs a measurement with ``threads`` threads on ``cores`` (None: any) keeps busy."""
    allowed = sorted(cores or os.sched_getaffinity(0))
    return [allowed[i % len(allowed)] for i in range(threads)]


class HostSpeed:
    """Probes of one host, kept in ``path`` (a JSON map from CPU set to the latest probe times): read
    once, by the first probe, then written after each (the last process to write keeps its history)."""

    def __init__(self, path: Path, probe: Callable[[list[int]], float] = probe_ms,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self._probe, self._sleep, self._clock = path, probe, sleep, clock
        self._history: dict[str, list[float]] | None = None

    def slowness(self, cpus: list[int]) -> float:
        """A probe's time over the normal time (1.0: the usual state; NaN until :data:`MIN_HISTORY` probes)."""
        if self._history is None:
            self._history = self._load()
        history = self._history.setdefault(",".join(map(str, cpus)), [])
        normal = statistics.median(history) if len(history) >= MIN_HISTORY else math.nan
        taken = self._probe(cpus)
        history.append(taken)
        del history[:-HISTORY]
        self._save()
        return taken / normal

    def settle(self, cpus: list[int], max_wait_s: float) -> float:
        """Probe until the host is in its usual state (within :data:`TOLERANCE`) or ``max_wait_s`` has
        passed: the last probe's slowness."""
        deadline = self._clock() + max_wait_s
        while True:
            slowness = self.slowness(cpus)
            if not abs(slowness - 1) > TOLERANCE or self._clock() >= deadline:  # NaN: nothing to judge by yet
                return slowness
            self._sleep(POLL_S)

    def _load(self) -> dict[str, list[float]]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(self._history))
        tmp.replace(self.path)  # atomic: processes that probe at once never read half a file
