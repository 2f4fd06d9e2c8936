"""Profile a model: its fused operators timed one by one, the whole model on the Relax VM and PyTorch eager
(each in a measurer's worker: the built model checked against the model's reference first)."""
from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.measure.estimate import estimated_ms
from opbench.measure.measurer import Measurer
from opbench.measure.memory import planned_memory, schedule_memory
from opbench.measure.models import export_model, save_inputs
from opbench.measure.protocol import ModelInput, RunResult
from opbench.record import WORKSPACE_METRIC, Status
from opbench.workloads.models.cache import imported
from opbench.workloads.models.extract import FusedOp, fused_ops, mark_shares
from opbench.workloads.models.sources import ModelSource

INPUTS, UNTUNED, TUNED = "inputs.npz", "untuned.so", "tuned.so"  # in a model study's folder


@dataclass(frozen=True)
class OpProfile:
    """A fused operator's untuned time (ms a call) and memory, as a profile measured them."""

    latency_ms: float
    memory: dict[str, float]


@dataclass
class ModelProfile:
    source: ModelSource
    mod: Any  # the fused Relax module
    ops: list[FusedOp]
    funcs: dict[str, Any]  # PrimFunc per op name
    ops_ms: float  # sum over ops of calls x latency
    model_ms: float  # the untuned build's time (NaN when it was not built)
    torch_ms: float  # NaN without a torch module (ONNX)
    max_abs_err: float
    untuned_library: Path | None  # the untuned build, exported (None when it was not asked for)
    inputs: Path  # its inputs and the reference output (.npz)
    planned: dict[str, float]  # mem.weights, mem.activations (after Relax's memory planning), mem.largest_workspace


def torch_ms(measurer: Measurer, source: ModelSource, batch: int, seq_len: int, threads: int) -> float:
    """PyTorch eager: median ms per forward, in a fresh process that never imports TVM (NaN without a
    PyTorch module: an ONNX model)."""
    if not source.has_module:
        return math.nan
    run = measurer.time_models_fresh([ModelInput(source.name, batch, seq_len, resources=Resources(threads))])[0]
    return estimated_ms(run, measurer.timing.agree)


def time_built(measurer: Measurer, source: ModelSource, library: Path, inputs: Path, threads: int, what: str
               ) -> tuple[float, float]:
    """A built model timed in the measurer's kernel worker after its output was checked against the
    model's reference: (median ms, max |error|); raises when it differs or fails."""
    run = measurer.time_model(ModelInput(source.name, library=str(library), inputs=str(inputs), resources=Resources(threads)))
    return checked_ms(run, source.name, what, f"{reference_name(source)}'s", measurer.timing.agree), run.max_abs_err


def checked_ms(run: RunResult, model: str, what: str, reference: str, agree: float) -> float:
    """A built model's run: its estimate, ms; raises where its output differed from ``reference`` or it failed."""
    if run.status is Status.WRONG_RESULT:
        raise OpBenchError(f"{model}: {what}'s output differs from {reference} (max |err| {run.max_abs_err:.3g})")
    if run.status is not Status.OK:
        raise OpBenchError(f"{model}: {what} did not run: {run.error}")
    return estimated_ms(run, agree)


def reference_name(source: ModelSource) -> str:
    return "torch" if source.has_module else "ONNX's reference evaluator"


def profile_model(source: ModelSource, target: Any, measurer: Measurer, folder: Path, threads: int, batch: int,
                  seq_len: int, on_op: Callable[[int, FusedOp], None] = lambda i, op: None,
                  untuned: bool = True, kept: dict[str, OpProfile] | None = None,
                  warming: Future[None] | None = None) -> ModelProfile:
    """Import, fuse and time ``source`` (untuned: TVM's default lowering of every operator, each operator's
    time and memory taken from ``kept`` where it has them); the untuned build (when ``untuned``: BERT-base's
    takes 46 s a run here) and the inputs (with the reference output) are kept in ``folder``; each operator's
    memory and the model's planned memory beside the times. ``warming``: the measurer's workers starting, in
    the background (awaited before anything is timed)."""
    import tvm

    model = imported(source, batch, seq_len)
    mod = model.mod
    ops, funcs = fused_ops(mod)
    if warming is not None:
        warming.result()
    eager = torch_ms(measurer, source, batch, seq_len, threads)
    for n, op in enumerate(ops, start=1):
        if kept and op.name in kept:
            op.latency_ms, op.memory = kept[op.name].latency_ms, dict(kept[op.name].memory)
        else:
            op.latency_ms = measurer.time_primfunc(funcs[op.name], target, Resources(threads))
            op.memory = schedule_memory(tvm.IRModule({"main": funcs[op.name]}), target, funcs[op.name], threads, op.outputs)
        on_op(n, op)
    ops_ms = mark_shares(ops)
    inputs = save_inputs(model.inputs, folder / INPUTS, model.reference)
    library, model_ms, err = None, math.nan, math.nan
    if untuned:
        library = export_model(mod, target, folder / UNTUNED)
        model_ms, err = time_built(measurer, source, library, inputs, threads, "TVM")
    planned = {**planned_memory(mod), "mem.largest_workspace": max((o.memory[WORKSPACE_METRIC] for o in ops), default=0.0)}
    return ModelProfile(source, mod, ops, funcs, ops_ms, model_ms, eager, err, library, inputs, planned)
