"""The workload catalogue: ``parse_workload("matmul:m=512,n=512,k=512")`` or a preset name."""
from __future__ import annotations

import functools

from opbench.exceptions import WorkloadError
from opbench.workloads._base import BF16, INT8, SUPPORTED_DTYPES, Axis, Operator, Workload, numpy_dtype
from opbench.workloads.fused import MODEL_PREFIX, model_name, model_spec
from opbench.workloads.ops import OPERATORS, parse_value
from opbench.workloads.presets import PRESETS

__all__ = ["BF16", "INT8", "numpy_dtype", "Axis", "Operator", "Workload", "OPERATORS", "PRESETS", "parse_workload", "task_key_of"]


@functools.cache
def task_key_of(name: str) -> str | None:
    """The canonical task of a workload name (:attr:`Workload.task_key`), None where it no longer parses
    (an operator renamed, a model operator whose extraction is not cached here)."""
    from opbench.exceptions import OpBenchError

    try:
        return parse_workload(name).task_key
    except OpBenchError:
        return None


def parse_workload(text: str) -> Workload:
    """Read ``OP:key=value,...`` or a preset name into a :class:`Workload`.

    Raises :class:`WorkloadError` naming the unknown operator/preset or the bad key.
    """
    text = text.strip()
    if text.startswith(MODEL_PREFIX):  # a model's operator, named model:NAME/FUNC
        workload = parse_workload(model_spec(text))
        p = workload.params
        return Workload(workload.op, p, workload.dtype, preset=model_name(p["model"], p["func"], p["batch"],
                                                                            p["seq_len"]))
    if text in PRESETS:
        workload = parse_workload(PRESETS[text].spec)
        return Workload(workload.op, workload.params, workload.dtype, preset=text)
    name, sep, body = text.partition(":")
    if name not in OPERATORS:
        if not sep:
            raise WorkloadError(
                f"unknown workload '{text}': not a preset ({', '.join(PRESETS)}) "
                f"and not written OP:key=value,... with OP one of {', '.join(OPERATORS)}"
            )
        raise WorkloadError(f"unknown operator '{name}'; known operators: {', '.join(OPERATORS)}")
    op = OPERATORS[name]
    given: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise WorkloadError(f"{name}: malformed item '{item}', expected key=value")
        if key in given:
            raise WorkloadError(f"{name}: key '{key}' given twice")
        given[key.strip()] = parse_value(value.strip())
    dtype = str(given.pop("dtype", "float32"))
    if dtype not in op.dtypes:
        known = "" if dtype in SUPPORTED_DTYPES else f" (OpBench knows {', '.join(SUPPORTED_DTYPES)})"
        raise WorkloadError(f"{name}: unsupported dtype '{dtype}'; {name} takes {', '.join(op.dtypes)}{known}")
    unknown = set(given) - set(op.keys) - set(op.options)
    if unknown:
        raise WorkloadError(
            f"{name}: unknown key(s) {', '.join(sorted(unknown))}; keys are {', '.join(op.keys)}"
            + (f", options {', '.join(f'{k}={v}' for k, v in op.options.items())}" if op.options else "")
        )
    missing = [k for k in op.keys if k not in given]
    if missing:
        raise WorkloadError(f"{name}: missing key(s) {', '.join(missing)}; an {name} needs {', '.join(op.keys)}")
    params = {**op.options, **given}
    op.check(params)
    return Workload(op, params, dtype)
