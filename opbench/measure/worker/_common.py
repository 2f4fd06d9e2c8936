"""What the workers of both roles and their parent share: roles, the start message, a workload's inputs made
once, the cache-flush size, one timed series, errors in brief."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opbench.hardware.quiet import HostLoad
from opbench.measure.timing import TimingPolicy

READY = "ready"  # a worker's first message: started
KERNEL, LIBRARY = "kernel", "library"  # a worker's role: TVM builds and kernels, or library baselines only
EXPECTED = "expected"  # in a model's saved inputs (.npz): its reference output, beside arg0, arg1, ...
FLUSH_BYTES = 64 << 20  # evicted before each call when Timing.cache_flush: larger than any LLC here


def short_error(exc: BaseException, limit: int = 1500) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[:300] + " ... " + text[-(limit - 305):]


class Inputs:
    """A workload's input arrays and its reference output, made once per worker."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[list[Any], Any]] = {}

    def __call__(self, spec: str) -> tuple[list[Any], Any]:
        if spec not in self._cache:
            from opbench.workloads import parse_workload

            workload = parse_workload(spec)
            arrays = workload.make_inputs()
            self._cache[spec] = (arrays, workload.reference(arrays))
        return self._cache[spec]




def time_series(timing: TimingPolicy, first_s: float, call: Callable[[], object],
                evaluate: Callable[[int, int], Sequence[float]]) -> tuple[list[float], int, dict[str, float]]:
    """One series as ``timing`` shapes it, after a first call that took ``first_s``: ``evaluate(number,
    repeats)`` times ``repeats`` repeats of ``number`` calls (seconds per call each); the warm-up repeats
    are dropped. The kept latencies, ``number``, and the host's load while timing."""
    number, repeat = timing.series_shape(first_s, call)
    warmups = timing.warmup_repeats(first_s)
    load = HostLoad()
    load.start()
    latencies = list(evaluate(number, repeat + warmups))[warmups:]
    return latencies, number, load.stop()
