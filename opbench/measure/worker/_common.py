"""What the workers of both roles and their parent share: roles, the start message, a workload's inputs made
once, the cache-flush size, one timed series, errors in brief."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from opbench.hardware.quiet import HostLoad
from opbench.measure.protocol import RunResult
from opbench.measure.timing import TimingPolicy
from opbench.record import Status

READY = "ready"  # a worker's first message: started
KERNEL, LIBRARY = "kernel", "library"  # a worker's role: TVM builds and kernels, or library baselines only
EXPECTED = "expected"  # in a model's saved inputs (.npz): its reference output, beside arg0, arg1, ...
FLUSH_BYTES = 64 << 20  # a library's cold state: this much written before each call, larger than any LLC here
COLD = "cache_flush_cpu_non_first_arg"  # a kernel's cold state: TVM evicts every argument but the first (the activation)
MODEL_TOLERANCE = 1e-3  # a whole model's output against its reference: relative and absolute


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




def saved_inputs(path: str) -> tuple[list[Any], Any]:
    """A model's saved inputs (``arg0``, ``arg1``, ...) and its reference output (None when not saved)."""
    import numpy as np

    with np.load(path) as saved:
        arrays = {name: saved[name] for name in saved.files}
    expected = arrays.pop(EXPECTED, None)
    return [arrays[f"arg{i}"] for i in range(len(arrays))], expected


def first_output(out: Any) -> Any:
    """The first output of a model's call as a numpy array (from a tensor, TVM's or torch's, a list or a
    tuple of them, or numpy)."""
    import numpy as np

    while not hasattr(out, "numpy") and not isinstance(out, np.ndarray) and hasattr(out, "__getitem__"):
        out = out[0]
    if hasattr(out, "detach"):
        out = out.detach().cpu()
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def check_output(model: str, out: Any, expected: Any) -> tuple[float, RunResult | None]:
    """The max |error| of a model's first output against its reference, and the wrong-result answer when
    it differs (NaN and None without a reference): :func:`outputs_agree`; a quantized model's agrees with its fp32
    reference instead (cosine similarity at least :data:`~opbench.workloads.models.quantize.AGREEMENT`)."""
    import numpy as np

    from opbench.workloads.models.quantize import AGREEMENT, cosine, is_quantized

    if expected is None:
        return math.nan, None
    got = first_output(out)
    err = float(np.max(np.abs(got - expected)))
    if is_quantized(model):
        similarity = cosine(got, expected)
        if similarity >= AGREEMENT:
            return err, None
        why = f"cosine similarity {similarity:.4f} < {AGREEMENT} (max |err| = {err:.3g})"
    elif outputs_agree(got, expected):
        return err, None
    else:
        why = f"max |err| = {err:.3g}"
    return err, RunResult(Status.WRONG_RESULT, f"{model}: output differs from the reference: {why}", max_abs_err=err)


def outputs_agree(got: Any, expected: Any) -> bool:
    """Whether a float model's output is its reference's: within :data:`MODEL_TOLERANCE`, relative, and absolute of
    the reference's largest magnitude where that is below 1 (a randomly initialised MobileNetV2's output is ~1e-27,
    which any output would match within an absolute 1e-3)."""
    import numpy as np

    magnitude = float(np.max(np.abs(expected))) if np.size(expected) else 0.0
    return bool(np.allclose(got, expected, rtol=MODEL_TOLERANCE, atol=MODEL_TOLERANCE * min(1.0, magnitude)))


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
