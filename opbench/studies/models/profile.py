"""Profile a model: its fused operators timed one by one, the whole model on the Relax VM, PyTorch
eager, and the output checked against the model's reference."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from opbench.exceptions import OpBenchError
from opbench.measure.inprocess import time_model, time_primfunc
from opbench.studies.models.fresh import in_fresh_process, torch_ms_here
from opbench.workloads.models.extract import (
    FusedOp,
    fuse,
    fused_ops,
    import_model,
    mark_shares,
)
from opbench.workloads.models.sources import ModelSource


@dataclass
class ModelProfile:
    source: ModelSource
    mod: Any  # the fused Relax module
    ops: list[FusedOp]
    funcs: dict[str, Any]  # PrimFunc per op name
    ops_ms: float  # sum over ops of calls x latency
    model_ms: float
    torch_ms: float  # NaN without a torch module (ONNX)
    max_abs_err: float


def torch_ms(name: str, batch: int, seq_len: int, threads: int, repeat: int) -> float:
    """PyTorch eager: median ms per forward, timed in a fresh process under the host timing lock (TVM's
    thread pool, once started, keeps the cores busy-waiting and would slow PyTorch down many times over)."""
    return in_fresh_process(torch_ms_here, name, batch, seq_len, threads, repeat)


def reference_name(source: ModelSource) -> str:
    return "torch" if source.module is not None else "ONNX's reference evaluator"


def check_outputs(source: ModelSource, outputs: list[np.ndarray], what: str) -> float:
    """Max |error| of ``outputs`` against the model's reference; raises when they differ."""
    expected = source.reference()
    err = float(np.max(np.abs(outputs[0] - expected[0])))
    if not np.allclose(outputs[0], expected[0], rtol=1e-3, atol=1e-3):
        raise OpBenchError(f"{source.name}: {what}'s output differs from {reference_name(source)}'s "
                           f"(max |err| {err:.3g})")
    return err


def profile_model(source: ModelSource, target: Any, threads: int, repeat: int, batch: int, seq_len: int,
                  on_op: Callable[[int, FusedOp], None] = lambda i, op: None) -> ModelProfile:
    """Import, fuse and time ``source`` (untuned: TVM's default lowering of every operator)."""
    eager = torch_ms(source.name, batch, seq_len, threads, repeat) if source.module is not None else math.nan
    mod = fuse(import_model(source))
    ops, funcs = fused_ops(mod)
    for n, op in enumerate(ops, start=1):
        op.latency_ms = time_primfunc(funcs[op.name], target, repeat)
        on_op(n, op)
    ops_ms = mark_shares(ops)
    model_ms, outputs = time_model(mod, target, source.numpy_inputs(), repeat)
    err = check_outputs(source, outputs, "TVM")
    return ModelProfile(source, mod, ops, funcs, ops_ms, model_ms, eager, err)
