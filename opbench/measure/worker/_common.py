"""What the workers of both roles and their parent share: roles, the start message, a workload's inputs made
once, the cache-flush size, errors in brief."""
from __future__ import annotations

from typing import Any

READY = "ready"  # a worker's first message: started
KERNEL, LIBRARY = "kernel", "library"  # a worker's role: TVM builds and kernels, or library baselines only
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


