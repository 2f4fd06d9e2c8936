"""How one series of calls is sized and timed, in a kernel or library worker: calls per repeat from the
first calls, repeats within a budget, and a noisy series taken again."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from opbench.hardware.quiet import HostLoad
from opbench.measure.protocol import Timing

# A series of a slow kernel lasts about this long at most: it takes fewer repeats (at least MIN_REPEATS),
# and is not measured again for a high CV. A config 200x slower than the best (300-600 ms matmul-512
# configs, which TPE samples) otherwise took 2.5-11 s of a ~2 s trial budget.
SERIES_BUDGET_S = 1.0
MIN_REPEATS = 3


def timed(timing: Timing, attempt: Callable[[], list[float]]) -> tuple[list[float], int, dict[str, float]]:
    """Run ``attempt`` (one timed series: per-call seconds, one per repeat) again while its CV exceeds
    ``timing.max_cv``, at most ``timing.max_remeasures`` more times and only while a series lasts at most
    :data:`SERIES_BUDGET_S`; the steadiest series, the extra attempts taken and the host's load during
    the series kept."""
    best: tuple[float, list[float], dict[str, float]] | None = None
    load = HostLoad()
    for extra in range(timing.max_remeasures + 1):  # noqa: B007 - the last value is returned
        load.start()
        tick = time.perf_counter()
        latencies = attempt()
        cv = _cv(latencies)
        if best is None or cv < best[0]:
            best = (cv, latencies, load.stop())
        if cv <= timing.max_cv or time.perf_counter() - tick > SERIES_BUDGET_S:
            break
    assert best is not None
    return best[1], extra, best[2]


def _cv(latencies: list[float]) -> float:
    mean = statistics.fmean(latencies)
    return statistics.pstdev(latencies) / mean if mean > 0 else 0.0


def series_shape(timing: Timing, first_s: float, call: Callable[[], object]) -> tuple[int, int]:
    """Calls per timed repeat (``number``) and repeats of a series of ``call``, whose first call took
    ``first_s``. A first call shorter than a repeat should last is followed by a second, which sizes the
    series: the first starts the thread pool (a forked run's always does) and touches everything cold,
    so matmul-512's 1.3 ms kernels got 7-15 calls a repeat, whose 50 ms repeats lasted 9-20 ms."""
    one_call_s = first_s
    if not timing.cache_flush and first_s < timing.min_repeat_ms / 1e3:
        tick = time.perf_counter()
        call()
        one_call_s = min(first_s, time.perf_counter() - tick)
    number = 1 if timing.cache_flush else calls_per_repeat(timing.min_repeat_ms, one_call_s)
    return number, repeats(timing, number * one_call_s)


def repeats(timing: Timing, repeat_s: float) -> int:
    """Timed repeats of a series whose repeats last ``repeat_s``: ``timing.repeat``, fewer (down to
    :data:`MIN_REPEATS`) where they would take longer than :data:`SERIES_BUDGET_S`."""
    fit = math.floor(SERIES_BUDGET_S / max(repeat_s, 1e-9))
    return min(timing.repeat, max(MIN_REPEATS, fit))


def calls_per_repeat(min_repeat_ms: float, one_call_s: float) -> int:
    """Calls per timed repeat so that one repeat lasts at least ``min_repeat_ms``."""
    return max(1, math.ceil(min_repeat_ms / 1e3 / max(one_call_s, 1e-7)))


