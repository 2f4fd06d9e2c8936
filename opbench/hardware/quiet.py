"""How quiet the host is around a timed run: the load others put on our cores, and our own TVM pool.

TVM's thread pool keeps its workers spinning after a parallel kernel returns (see
:data:`opbench.hardware.resources.POOL_SPIN_COUNT`, which shortens it). Run workers, before they answer (so
before the host timing lock is released), wait for their own pool to go idle with
:func:`wait_until_idle`: the next timed run, in whichever process, starts on quiet cores.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def wait_until_idle(limit_s: float = 1.0, window_s: float = 0.002, busy_frac: float = 0.2, quiet_windows: int = 5) -> float:
    """Block until this process uses less than ``busy_frac`` of a core over ``quiet_windows`` windows of
    ``window_s`` in a row (its TVM pool stopped spinning: one quiet window can fall in a pause of a
    pool that is still starting), at most ``limit_s``; returns the seconds waited."""
    start = time.perf_counter()
    quiet = 0
    while quiet < quiet_windows and time.perf_counter() - start < limit_s:
        cpu = time.process_time()
        tick = time.perf_counter()
        time.sleep(window_s)
        quiet = quiet + 1 if time.process_time() - cpu < busy_frac * (time.perf_counter() - tick) else 0
    return time.perf_counter() - start


def _busy_jiffies(cores: Iterable[int]) -> int:
    """Busy jiffies (all but idle and iowait) summed over ``cores``, from /proc/stat."""
    wanted = {f"cpu{c}" for c in cores}
    busy = 0
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            name, *fields = line.split()
            if name in wanted:
                values = [int(v) for v in fields[:8]]
                busy += sum(values) - values[3] - values[4]
    return busy


class HostLoad:
    """Samples the host's load around a timed window: ``load_1m`` (the 1-minute load average when it
    started) and ``other_busy_frac`` (the share of our cores that other processes kept busy)."""

    def __init__(self) -> None:
        self._cores = sorted(os.sched_getaffinity(0))
        self._start: tuple[float, float, int] = (0.0, 0.0, 0)
        self._load_1m = 0.0

    def start(self) -> None:
        self._load_1m = os.getloadavg()[0]
        self._start = (time.perf_counter(), _own_cpu_s(), _busy_jiffies(self._cores))

    def stop(self) -> dict[str, float]:
        wall0, own0, busy0 = self._start
        wall = time.perf_counter() - wall0
        others = (_busy_jiffies(self._cores) - busy0) * _TICK_S - (_own_cpu_s() - own0)
        share = min(1.0, max(0.0, others / (wall * len(self._cores)))) if wall > 0 else 0.0
        return {"load_1m": self._load_1m, "other_busy_frac": share}


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system
