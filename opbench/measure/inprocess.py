"""A timing in this process, for what neither a TrialSpec nor a ModelInput describes: a model's fused operator
compiled alone from its PrimFunc (``opbench model-ops``, ``tune-model``'s profile). The timed series holds
the host timing lock exclusively, as every timed run on the host does; compiling does not."""
from __future__ import annotations

from typing import Any

import numpy as np

from opbench import settings
from opbench.hardware.lock import DEFAULT_LOCK, HostLock

MIN_REPEAT_MS = 20  # a fused operator's repeats in a model's profile at most (shorter where OPBENCH_MIN_REPEAT_MS is)


def _timed(fn: Any, dev: Any, args: list[Any], min_ms: int, repeat: int) -> float:
    """Median ms of ``repeat`` timed repeats of a TVM function (each at least ``min_ms`` long)."""
    evaluator = fn.time_evaluator("main", dev, number=1, repeat=repeat + 1, min_repeat_ms=min_ms)
    return float(np.median(list(evaluator(*args).results)[1:])) * 1e3


def time_primfunc(func: Any, target: Any, repeat: int = settings.REPEAT, lock: HostLock | None = None) -> float:
    """One call of a PrimFunc on random inputs, compiled alone for ``target`` (ms), timed under the host lock."""
    import tvm

    dev = tvm.cpu()
    executable = tvm.compile(tvm.IRModule({"main": func}), target)
    rng = np.random.default_rng(0)
    args = []
    for buffer in func.params:
        shape = [int(d) for d in buffer.shape]
        data = rng.standard_normal(shape) if "float" in str(buffer.dtype) else rng.integers(0, 2, shape)
        args.append(tvm.runtime.tensor(data.astype(str(buffer.dtype)), dev))
    with (lock or HostLock(DEFAULT_LOCK)).exclusive():
        return _timed(executable.mod, dev, args, max(1, int(min(MIN_REPEAT_MS, settings.min_repeat_ms()))), repeat)
