"""How fast the host runs our threads right now: a probe, its normal time, and waiting out spells.

A probe runs four loops on the measurement's cores: ``compute`` (a small matrix product in L1/L2) and
``memory`` (a sum over :data:`MEMORY_PROBE_BYTES`, past L2) on each core at once, ``sync`` (a larger product on
each core, started together, timed to the last one's end, as a parallel kernel runs: slow while the vCPUs take
turns on one CPU, which the per-core loops' medians of short calls hide) and ``exchange`` (each thread reads what
the next one has just written, as one stage of a parallel kernel reads another's output: slow where the cores
share no cache). Its slowness is each loop's time over its usual time among this user's last :data:`HISTORY`
probes, of the last :data:`RECENT_S` seconds when there are enough of them (:func:`usual_time`), kept in a file.
Why four loops, and what each catches: docs/measurement.md#probes.
"""
from __future__ import annotations

import functools
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from opbench.paths import user_runtime_dir, write_private

HOST_SPEED_FILE = "host-speed.json"  # in the user's private folder: another user cannot poison it
PROBE_SIZE = 128  # square float32 matrices: 4 MFLOP a call, in cache on any CPU
PROBE_CALLS = 20
MEMORY_PROBE_BYTES = 3 << 20  # a float32 vector per thread: past a 1-2 MB L2, within a shared L3
MEMORY_PROBE_CALLS = 15  # ~0.2 ms a sum here
PARALLEL_PROBE_SIZE = 384  # the parallel loop's square float32 matrices: ~1 ms a product on a Zen 4 core
PARALLEL_PROBE_CALLS = 3
EXCHANGE_PROBE_BYTES = 512 << 10  # each thread's buffer, written by it and read by the next: within any L2 here
EXCHANGE_PROBE_ROUNDS = 15
SLOWNESS_COLUMNS = ("host_slowness", "host_memory_slowness", "host_sync_slowness",
                    "host_exchange_slowness")  # Slowness's fields, as record columns
HISTORY = 200  # probes among which the usual time is found (usual_time) ...
RECENT_S = 600.0  # ... those of the last this many seconds when there are RECENT_PROBES of them (docs/measurement.md#probes)
RECENT_PROBES = 30
MIN_HISTORY = 5  # probes taken before the first one is judged
PROBE_WARM_MS = 10.0  # each probe thread keeps its core busy this long before it times
TOLERANCE = 0.10  # a probe within this of its normal time finds the host in its usual state
SPELL = 1.2  # the compute, memory or parallel loop over this many times its usual time: a spell (#probes)
CORES_APART = 2.0  # an exchange over this many times its usual time: the cores share no cache (docs/measurement.md#probes)
EXCHANGE_HISTORY = 1000  # exchange probes kept: its usual time is their fastest twentieth (shared_cache_time)


class Probe(NamedTuple):
    """One probe of the host: the slowest thread's median time (ms) of each per-core loop, the parallel loop's
    median time (ms), and the slowest thread's exchange time (ms: :func:`_exchange_ms`)."""

    compute_ms: float
    memory_ms: float
    sync_ms: float = math.nan
    exchange_ms: float = math.nan


class Slowness(NamedTuple):
    """A probe's times over their normal times (1.0: the usual state; NaN until :data:`MIN_HISTORY`
    probes): the columns ``host_slowness``, ``host_memory_slowness``, ``host_sync_slowness`` and
    ``host_exchange_slowness`` (not part of :attr:`deviation`: it decides :attr:`cores_apart`)."""

    compute: float
    memory: float
    sync: float = math.nan
    exchange: float = math.nan

    @property
    def deviation(self) -> float:
        """How far the host is from its usual state: the largest relative deviation of the compute, memory and
        parallel loops (0.0 while NaN)."""
        return max((abs(x - 1) for x in (self.compute, self.memory, self.sync) if x == x), default=0.0)

    @property
    def usual(self) -> bool:
        return self.deviation <= TOLERANCE

    @property
    def cores_apart(self) -> bool:
        """Whether the probed cores share no cache now (the exchange over :data:`CORES_APART` x its usual time; False
        while NaN): kernels whose threads read each other's output run up to 2x slow (docs/measurement.md#probes)."""
        return self.exchange > CORES_APART

    @property
    def settled(self) -> bool:
        """What a placement waits for: none of the compute, memory and parallel loops over :data:`SPELL` x its usual
        time, and the cores sharing a cache (NaN: not probed, settled)."""
        return not (any(x > SPELL for x in (self.compute, self.memory, self.sync)) or self.cores_apart)

    def unsettled_by(self) -> str:
        """What keeps the host unsettled, for a message: the loops over :data:`SPELL` x their usual time, and the
        cores sharing no cache ("" when settled)."""
        slow = [f"{name} {x:.2f}x its usual time" for name, x in zip(("compute", "memory", "parallel"),
                                                                   (self.compute, self.memory, self.sync)) if x > SPELL]
        return ", ".join(slow + ["its cores sharing no cache"] * self.cores_apart)

    def as_load(self) -> dict[str, float]:
        return dict(zip(SLOWNESS_COLUMNS, self))

    @classmethod
    def of(cls, values: Mapping[str, float]) -> Slowness:
        """The slowness in a run's load or a record (NaN where it was not probed)."""
        return cls(*(values.get(key, math.nan) for key in SLOWNESS_COLUMNS))


def furthest_from_usual(slowness: Iterable[float], default: float = math.nan) -> float:
    """The value furthest from 1.0 (the usual state), NaNs left out; ``default`` when all are."""
    return max((x for x in slowness if x == x), key=lambda x: abs(x - 1), default=default)


def usual_time(history: Sequence[float]) -> float:
    """The median of the most probes of ``history`` that one time holds within :data:`TOLERANCE` (moved
    as little as that needs; of equal bands, the one nearest the median of all). Of a host in one state
    that is about the median of all; of a host that switches between states, the most frequent one, where
    the median of all can lie between them, in a state the host is never in (docs/measurement.md#probes)."""
    ordered = sorted(history)
    median = statistics.median(ordered)
    best = (0, 0.0, median)  # (probes within the band, minus its distance from the median of all, its time)
    lo = 0
    for hi, taken in enumerate(ordered):
        while taken * (1 - TOLERANCE) > ordered[lo] * (1 + TOLERANCE):
            lo += 1
        middle = (ordered[(lo + hi) // 2] + ordered[(lo + hi + 1) // 2]) / 2
        centre = min(max(middle, taken / (1 + TOLERANCE)), ordered[lo] / (1 - TOLERANCE))  # holds all of them
        best = max(best, (hi - lo + 1, -abs(centre - median), centre))
    return best[2]


def shared_cache_time(history: Sequence[float]) -> float:
    """The exchange's usual time: the fastest twentieth of ``history``, the cores sharing a cache however long they
    have not since (a host whose vCPUs share none for minutes would otherwise make that its usual state)."""
    return statistics.quantiles(history, n=20, method="inclusive")[0]


def probe_ms(cpus: list[int], calls: int = PROBE_CALLS) -> Probe:
    """``len(cpus)`` threads, one pinned to each CPU, each busy for :data:`PROBE_WARM_MS`
    first (a core that idled runs slow for its first milliseconds), then all at once timing ``calls``
    single-threaded ``PROBE_SIZE``-square matrix products, then :data:`MEMORY_PROBE_CALLS` sums of its own
    :data:`MEMORY_PROBE_BYTES` vector: the slowest thread's median of each (ms); then :data:`EXCHANGE_PROBE_ROUNDS`
    rounds in which each thread writes its :data:`EXCHANGE_PROBE_BYTES` buffer and, after a barrier, sums the next
    thread's: the slowest thread's (:func:`_exchange_ms`; NaN on one CPU); then :data:`PARALLEL_PROBE_CALLS` rounds
    in which every thread, after a barrier, takes one :data:`PARALLEL_PROBE_SIZE`-square product: the median over
    rounds of the slowest thread's time (ms). (Not BLAS's own threads: they spin on after a product, here slowing the
    placement that followed 2x.)"""
    a, big = _probe_matrix(PROBE_SIZE), _probe_matrix(PARALLEL_PROBE_SIZE)
    warm_s = PROBE_WARM_MS / 1e3
    medians: list[Probe] = [Probe(0.0, 0.0)] * len(cpus)
    start = threading.Barrier(len(cpus))
    exchange_ms = [math.nan] * len(cpus)
    parallel_ms = [[0.0] * PARALLEL_PROBE_CALLS for _ in cpus]

    def run(i: int) -> None:
        os.sched_setaffinity(0, {cpus[i]})  # this thread only
        vector = _probe_vector(i)
        warm_until = time.perf_counter() + warm_s
        while time.perf_counter() < warm_until:
            a @ a
        start.wait()
        medians[i] = Probe(_median_ms(lambda: a @ a, calls), _median_ms(vector.sum, MEMORY_PROBE_CALLS))
        if len(cpus) > 1:
            exchange_ms[i] = _exchange_ms(_exchange_buffer(i), _exchange_buffer((i + 1) % len(cpus)), start.wait)
        for r in range(PARALLEL_PROBE_CALLS):
            start.wait()
            parallel_ms[i][r] = _median_ms(lambda: big @ big, 1)

    with _blas().limit(limits=1, user_api="blas"):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cpus))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    parallel = statistics.median(max(laps) for laps in zip(*parallel_ms))
    return Probe(max(m.compute_ms for m in medians), max(m.memory_ms for m in medians), parallel, max(exchange_ms))


def _median_ms(fn: Callable[[], object], times: int) -> float:
    laps = []
    for _ in range(times):
        tick = time.perf_counter()
        fn()
        laps.append(time.perf_counter() - tick)
    return statistics.median(laps) * 1e3


def _exchange_ms(own: Any, next_threads: Any, barrier: Callable[[], object]) -> float:
    """Over :data:`EXCHANGE_PROBE_ROUNDS` rounds, the median time (ms) to write ``own`` (which another thread read
    the round before: each line's copy in that core's cache is invalidated first) plus the median time to sum
    ``next_threads`` buffer just after its thread wrote it (each line fetched from that core's cache)."""
    writes, reads = [], []
    for value in range(EXCHANGE_PROBE_ROUNDS):
        tick = time.perf_counter()
        own.fill(value)
        writes.append(time.perf_counter() - tick)
        barrier()
        tick = time.perf_counter()
        next_threads.sum()
        reads.append(time.perf_counter() - tick)
        barrier()
    return (statistics.median(writes) + statistics.median(reads)) * 1e3


@functools.cache
def _probe_matrix(size: int) -> Any:
    import numpy as np

    return np.random.default_rng(0).random((size, size), dtype=np.float32)


@functools.cache
def _probe_vector(thread: int) -> Any:
    """Each probe thread's vector, allocated once per process."""
    import numpy as np

    return np.random.default_rng(thread).random(MEMORY_PROBE_BYTES // 4, dtype=np.float32)


@functools.cache
def _exchange_buffer(thread: int) -> Any:
    """Each probe thread's buffer for the exchange loop, allocated once per process."""
    import numpy as np

    return np.zeros(EXCHANGE_PROBE_BYTES // 4, dtype=np.float32)


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
    """Probes of one host, kept in ``path`` (a JSON map from CPU set, and CPU set + ``:memory``, ``:parallel`` or ``:exchange``,
    to the latest probes as [epoch s, ms], and CPU set + ``:settled`` to their verdicts as [epoch s, 1 or 0]): read
    once, by the first probe, then written after each (the last process to write keeps its history)."""

    def __init__(self, path: Path, probe: Callable[[list[int]], Probe] = probe_ms,
                 wall: Callable[[], float] = time.time) -> None:
        self.path, self._probe, self._wall = path, probe, wall
        self._history: dict[str, list[list[float]]] | None = None

    def slowness(self, cpus: list[int]) -> Slowness:
        """Probe the host now: each loop's time over its normal time; the probe joins the history."""
        history = self._known()
        taken = self._probe(cpus)
        key, now = ",".join(map(str, cpus)), self._wall()  # the verdict's time: when its readings ended
        slowness = Slowness(self._judge(key, taken.compute_ms),
                            self._judge(f"{key}:memory", taken.memory_ms),
                            self._judge(f"{key}:parallel", taken.sync_ms),
                            self._judge(f"{key}:exchange", taken.exchange_ms, shared_cache_time, EXCHANGE_HISTORY, recent=False))
        verdicts = history.setdefault(f"{key}:settled", [])
        verdicts.append([now, float(slowness.settled)])
        del verdicts[:-HISTORY]
        self._save()
        return slowness

    def unsettled_s(self, cpus: list[int]) -> float:
        """How long the probes of ``cpus`` (this process's and those it read) have found the host unsettled
        (:attr:`Slowness.settled`) without a break, up to the latest (0.0: the latest found it settled)."""
        since = now = self._wall()
        for at, settled in reversed(self._known().get(",".join(map(str, cpus)) + ":settled", [])):
            if settled:
                break
            since = at
        return now - since

    def _judge(self, key: str, taken: float, usual: Callable[[Sequence[float]], float] = usual_time,
               keep: int = HISTORY, recent: bool = True) -> float:
        """``taken`` over the usual time of ``key``'s last ``keep`` probes (with ``recent``, of those of the last
        :data:`RECENT_S` seconds when they hold :data:`RECENT_PROBES`: a host whose state changed for good is judged by
        the new one)."""
        if taken != taken:  # a probe without this loop
            return math.nan
        history, now = self._known().setdefault(key, []), self._wall()
        latest = [ms for at, ms in history if now - at <= RECENT_S] if recent else []
        pool = latest if len(latest) >= RECENT_PROBES else [ms for _, ms in history]
        normal = usual(pool) if len(pool) >= MIN_HISTORY else math.nan
        history.append([now, taken])
        del history[:-keep]
        return taken / normal

    def _known(self) -> dict[str, list[list[float]]]:
        """The history, read from the file by the first call."""
        if self._history is None:
            self._history = self._load()
        return self._history

    def _load(self) -> dict[str, list[list[float]]]:
        """The history in the file; probes without their time (an older OpBench's) are left out."""
        try:
            loaded = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(loaded, dict):
            return {}
        return {key: [p for p in probes if isinstance(p, list) and len(p) == 2] for key, probes in loaded.items()
                if isinstance(probes, list)}

    def _save(self) -> None:
        write_private(self.path, json.dumps(self._history).encode())  # processes that probe at once: no half files


def default_history() -> Path:
    """This user's probe history (:func:`opbench.paths.user_runtime_dir`)."""
    return user_runtime_dir() / HOST_SPEED_FILE
