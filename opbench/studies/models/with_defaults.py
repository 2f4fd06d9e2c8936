"""A model built with its template defaults, measured operator by operator and whole: what whole-model prediction
(:mod:`opbench.predictor.whole_model`) learns from and is scored on.

Each fused operator is timed alone with the schedule the model is built with (its template's default; TVM's default
lowering where no template writes its outputs), in the measurer's cache state (warm: as the catalogue's records,
which the operator predictor also learns from); the model is built with those schedules, and the built models are
timed together in new processes, their output checked against their reference.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from opbench.hardware.resources import Resources, host_facts, set_tvm_threads
from opbench.hardware.targets import make_target
from opbench.measure.measurer import Measurer
from opbench.measure.models import export_model, save_inputs
from opbench.measure.protocol import ModelInput
from opbench.predictor.whole_model import CALLS_COLUMN, MODEL_COLUMN, operator_features
from opbench.record import Status
from opbench.studies.models.profile import INPUTS, checked_ms
from opbench.studies.models.scheduled import scheduled_func
from opbench.studies.models.tune import ModelSpec
from opbench.studies.models.tuned import apply_database, default_op, write_database
from opbench.workloads import parse_workload
from opbench.workloads.fused import model_name
from opbench.workloads.models import cache
from opbench.workloads.models.extract import FusedOp, fused_ops
from opbench.workloads.models.sources import load_model

DEFAULTS_LIBRARY = "defaults.so"


@dataclass
class BuiltWithDefaults:
    ops: pd.DataFrame  # per fused operator: source_model, workload, kind, calls, template, cache_state, status,
    # latency_ms, feat.*
    run: ModelInput  # the model (its name) built with the same schedules, on the Relax VM, and its inputs


def build_with_defaults(spec: ModelSpec, measurer: Measurer, folder: Path,
                        on_op: Callable[[int, FusedOp, float], None] = lambda n, op, ms: None) -> BuiltWithDefaults:
    """``spec``'s model built with every operator's template default, each operator timed alone as the model runs
    it (``on_op`` hears each); the built library and its inputs are kept in ``folder``."""
    source = load_model(spec.model, spec.batch, spec.seq_len)
    set_tvm_threads(spec.threads)
    target, resources, host = make_target("llvm", spec.threads), Resources(spec.threads), host_facts()
    model = cache.imported(source, spec.batch, spec.seq_len)
    ops, funcs = fused_ops(model.mod)
    cache.save(spec.model, spec.batch, spec.seq_len, ops, funcs)  # where the operators' workloads are read from
    workloads = {op.name: parse_workload(model_name(spec.model, op.name, spec.batch, spec.seq_len)) for op in ops}
    # one record each: its cost (1) ranks nothing, but MetaSchedule applies only records with one
    chosen = {op.name: default_op(workloads[op.name], 1.0) for op in ops if op.outputs == 1}
    built = apply_database(model.mod, write_database(folder, list(chosen.values()), target), target)
    rows = []
    for n, op in enumerate(ops, start=1):
        latency = measurer.time_primfunc(scheduled_func(op, funcs[op.name], built), target, resources)
        on_op(n, op, latency)
        default = chosen.get(op.name)
        config, template = (default.config, default.template.name) if default else ({}, None)
        rows.append({MODEL_COLUMN: spec.model, "workload": workloads[op.name].name, "kind": op.kind,
                     CALLS_COLUMN: op.calls, "template": template, "threads": spec.threads,
                     "cache_state": measurer.timing.cache_state,
                     "status": (Status.OK if math.isfinite(latency) else Status.RUN_ERROR).value,
                     "latency_ms": latency,
                     **operator_features(workloads[op.name], op.kind, config, template, resources, host)})
    export_model(built, target, folder / DEFAULTS_LIBRARY)
    save_inputs(model.inputs, folder / INPUTS, model.reference)
    return BuiltWithDefaults(pd.DataFrame(rows), kept_build(spec.model, folder, spec.threads))


def kept_build(model: str, folder: Path, threads: int) -> ModelInput:
    """The model :func:`build_with_defaults` built into ``folder``, as a run on ``threads``."""
    return ModelInput(model, library=str(folder / DEFAULTS_LIBRARY), inputs=str(folder / INPUTS), resources=Resources(threads))


def time_interleaved(measurer: Measurer, built: list[ModelInput], placements: int) -> list[float]:
    """Each built model's estimate (ms) over ``placements`` new processes, the models' placements interleaved: a
    slow spell of a shared host (one slowed every placement of a model timed alone, 2x) falls on a placement of
    several models, which the estimate leaves out, not on every placement of one. Raises where a model's output
    differs from its reference or it fails."""
    runs = measurer.time_models_fresh(built, placements=placements)
    return [checked_ms(run, b.model, "the model (template defaults)", "its reference", measurer.timing.agree)
            for b, run in zip(built, runs)]
