"""A model tuned for a GPU: its fused matmuls and convolutions tuned with the CUDA templates (each one's
template default first), the model built with their best schedules and TVM's dlight rules for every other
operator, beside the same fused model scheduled by dlight alone. A GPU runs no unscheduled operator, so
the operators are chosen by their FLOPs, not by a profile of TVM's default lowering.
``tune_model_gpu(GpuModelTune(ModelSpec("bert-base@tiny")), measurer, sink, folder) -> GpuTunedModel``"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench.engines.loop import run_tuning
from opbench.engines.registry import EngineSpec, create_engine
from opbench.exceptions import OpBenchError, WorkloadError
from opbench.hardware.resources import Resources
from opbench.hardware.targets import make_target
from opbench.measure.measurer import Measurer
from opbench.measure.models import export_model, save_inputs
from opbench.measure.protocol import ModelInput, RunResult
from opbench.record import TrialRecord, best_ok, is_ok
from opbench.space import Template, get_template
from opbench.studies.configs import best_config
from opbench.studies.models.profile import INPUTS, TUNED
from opbench.studies.models.tune import ModelSpec
from opbench.studies.models.tuned import TunedOp, apply_database, write_database
from opbench.studies.verify import Verification, verify_runs
from opbench.workloads import Workload, parse_workload
from opbench.workloads.fused import model_name
from opbench.workloads.models import cache
from opbench.workloads.models.extract import FusedOp, fused_ops
from opbench.workloads.models.sources import load_model

log = logging.getLogger("opbench")

DLIGHT = "dlight.so"  # the fused model with every operator scheduled by dlight, in the study's folder
EAGER, DLIGHT_ROW = "torch eager", "TVM dlight"  # the rows a GPU-tuned model is verified beside


@dataclass(frozen=True)
class GpuModelTune:
    model: ModelSpec
    trials_per_op: int = 32  # the template default included
    max_ops: int | None = None  # tune at most this many operators, the most FLOPs a run first
    engine: EngineSpec = EngineSpec(seed=0)
    target: str = "cuda"

    def __post_init__(self) -> None:
        if self.trials_per_op < 1:
            raise OpBenchError(f"trials per operator must be >= 1, got {self.trials_per_op}")


@dataclass
class GpuTunedModel:
    tuned: Path  # the model built with the tuned schedules, dlight's for the rest
    dlight: Path  # the same fused model, every operator scheduled by dlight
    inputs: Path  # its inputs and PyTorch's output (.npz)
    rows: list[tuple[str, int, float, float]]  # per tuned operator: name, calls, template default ms, best ms
    trials: int  # built and timed, over all operators


def gpu_tunable(model: ModelSpec, ops: list[FusedOp], target: str) -> list[tuple[FusedOp, Workload, Template]]:
    """The model's single-output operators that have a template for ``target`` (with it), the most FLOPs a
    run first."""
    chosen = []
    for op in sorted((o for o in ops if o.outputs == 1), key=lambda o: -o.calls * o.flops):
        workload = parse_workload(model_name(model.model, op.name, model.batch, model.seq_len))
        try:
            chosen.append((op, workload, get_template(workload, target=target)))
        except WorkloadError:
            continue  # dlight schedules it
    return chosen


def tune_model_gpu(spec: GpuModelTune, measurer: Measurer, sink: Callable[[TrialRecord], None], folder: Path,
                   study: str = "") -> GpuTunedModel:
    """Tune the model's operators that have a template for ``spec.target``, then build it twice into
    ``folder``: with their best schedules, and with dlight's alone."""
    m = spec.model
    model = cache.imported(load_model(m.model, m.batch, m.seq_len), m.batch, m.seq_len)
    mod = model.mod
    ops, funcs = fused_ops(mod)
    cache.save(m.model, m.batch, m.seq_len, ops, funcs)
    resources = Resources(1, target=spec.target)  # one host thread drives the GPU
    target = make_target(spec.target, 1)
    tuned, rows, trials = [], [], 0
    for op, workload, template in gpu_tunable(m, ops, spec.target)[:spec.max_ops]:
        log.info("--- %s (%d calls, %.2f GFLOP a run): %d trials", op.name, op.calls, op.calls * op.flops / 1e9,
                 spec.trials_per_op)
        engine = create_engine(spec.engine, template.search_space(workload), workload, template, resources,
                               f"{study or m.model}-{spec.target}-{op.name}")
        records = run_tuning(engine, workload, spec.trials_per_op, measurer, sink, resources)
        engine.close()
        trials += sum(r["status"] != "invalid_config" for r in records)
        config, best = best_config(records, workload.name), best_ok(records)
        if config is None or best is None:
            log.info("    no config of %s ran: dlight schedules it", op.name)
            continue
        tuned.append(TunedOp(workload, template, template.validate(config, workload), best["latency_ms"]))
        default = records[0]["latency_ms"] if is_ok(records[0]) else math.nan  # the template default
        rows.append((op.name, op.calls, default, best["latency_ms"]))
    library, dlight = build_gpu_model(mod, tuned, target, folder)
    inputs = save_inputs(model.inputs, folder / INPUTS, model.reference)
    return GpuTunedModel(library, dlight, inputs, rows, trials)


def build_gpu_model(mod: Any, tuned: list[TunedOp], target: Any, folder: Path) -> tuple[Path, Path]:
    """The fused Relax module built for the GPU ``target`` into ``folder`` twice: with the ``tuned`` schedules
    (a MetaSchedule database; dlight schedules every other operator), and with dlight's alone."""
    database = write_database(folder / "database", tuned, target)
    return (export_model(apply_database(mod, database, target), target, folder / TUNED),
            export_model(mod, target, folder / DLIGHT))


def verify_gpu_model(measurer: Measurer, spec: GpuModelTune, built: GpuTunedModel, tuned_row: str, rounds: int
                     ) -> Verification:
    """The tuned build beside the dlight build and PyTorch eager, each timed on the GPU in fresh processes,
    ``rounds`` placements each (a build that fails is a row saying why)."""
    gpu, name = Resources(1, target=spec.target), spec.model.model
    runs = {EAGER: ModelInput(name, resources=gpu),
            DLIGHT_ROW: ModelInput(name, library=str(built.dlight), inputs=str(built.inputs), resources=gpu),
            tuned_row: ModelInput(name, library=str(built.tuned), inputs=str(built.inputs), resources=gpu)}
    timed: dict[str, RunResult | str] = dict(zip(runs, measurer.time_models_fresh(list(runs.values()), placements=rounds)))
    return verify_runs(list(runs), timed, {}, f"{name}-{spec.target}", rounds)
