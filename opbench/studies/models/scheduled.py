"""A model's operators with the schedules it would be built with (``opbench model-ops --schedules``): the
template defaults, or the tuned schedules of a MetaSchedule database (the folder ``tune-model`` writes).

The schedules are swapped into the fused model as a tuned model is built (:func:`apply_database`); each
operator whose PrimFunc changed is timed alone and its memory read again, a packed weight's bytes as
``mem.prepacked``; the model is built with them and timed after its output is checked.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.memory import bytes_of, planned_memory, schedule_memory
from opbench.measure.models import export_model
from opbench.record import MEM_PREFIX, WORKSPACE_METRIC
from opbench.studies.models.profile import ModelProfile, time_built
from opbench.studies.models.tuned import DATABASE_FILES, PREPACKED_SUFFIX, apply_database, default_op, write_database
from opbench.workloads import parse_workload
from opbench.workloads.fused import model_name
from opbench.workloads.models.extract import FusedOp, mark_shares

log = logging.getLogger("opbench")

UNTUNED, DEFAULTS = "untuned", "defaults"
SCHEDULES_HELP = (f"the schedules the operators are profiled with: '{UNTUNED}' (TVM's default lowering), "
                  f"'{DEFAULTS}' (each operator's template default) or a MetaSchedule database folder "
                  "(tune-model's: the tuned operators, the rest untuned)")


def parse_schedules(value: str) -> str:
    """``--schedules``: untuned, defaults, or a folder holding a MetaSchedule JSON database."""
    if value in (UNTUNED, DEFAULTS):
        return value
    missing = [name for name in DATABASE_FILES if not (Path(value) / name).is_file()]
    if missing:
        raise OpBenchError(f"'{value}' is neither {UNTUNED}, {DEFAULTS} nor a MetaSchedule database "
                           f"folder (no {' or '.join(missing)})")
    return value


def open_database(folder: Path) -> Any:
    """The MetaSchedule JSON database in ``folder``."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(*(str(folder / name) for name in DATABASE_FILES), allow_missing=False)


def defaults_database(prof: ModelProfile, model: str, batch: int, seq_len: int, target: Any, folder: Path) -> Any:
    """A database holding each operator's template default. Its records carry the untuned time as their cost:
    MetaSchedule applies only records with one, and each operator has one record, so the cost ranks nothing."""
    ops = []
    for op in prof.ops:
        if op.outputs != 1:  # no template writes two outputs
            continue
        ops.append(default_op(parse_workload(model_name(model, op.name, batch, seq_len)), op.latency_ms))
    return write_database(folder, ops, target)


def reschedule(prof: ModelProfile, database: Any, how: str, target: Any, measurer: Measurer, folder: Path,
               threads: int) -> ModelProfile:
    """``prof`` with every operator the database schedules timed and measured with that schedule
    (``how`` names it on the operator) and the model built with them: shares, planned memory and the whole
    model's time follow."""
    mod = apply_database(prof.mod, database, target)
    ops = [_rescheduled(op, prof.funcs[op.name], mod, how, target, measurer, threads) for op in prof.ops]
    changed = sum(op.schedule == how for op in ops)
    if not changed:
        raise OpBenchError(f"the database schedules none of {prof.source.name}'s operators (built for another "
                           "model, batch or target?)")
    log.info("%d of %d operators %s", changed, len(ops), how)
    ops_ms = mark_shares(ops)
    library = export_model(mod, target, folder / f"{how}.so")
    model_ms, err = time_built(measurer, prof.source, library, prof.inputs, threads, f"the model ({how})")
    planned = {**planned_memory(mod), "mem.largest_workspace": max(o.memory[WORKSPACE_METRIC] for o in ops)}
    return dataclasses.replace(prof, mod=mod, ops=ops, ops_ms=ops_ms, model_ms=model_ms, max_abs_err=err,
                               planned=planned)


def scheduled_func(op: FusedOp, func: Any, mod: Any) -> Any:
    """``op``'s PrimFunc as the scheduled module holds it (``<name>_prepacked`` where its weight is packed at build
    time), or ``func`` where the module does not hold it."""
    names = {g.name_hint for g in mod.functions}
    name = next((n for n in (f"{op.name}{PREPACKED_SUFFIX}", op.name) if n in names), None)
    return mod[name].with_attr("global_symbol", "main") if name else func


def _rescheduled(op: FusedOp, func: Any, mod: Any, how: str, target: Any, measurer: Measurer, threads: int) -> FusedOp:
    """``op`` as the scheduled module runs it (itself, untouched, when the database has no schedule for it);
    a schedule that packs a weight at build time takes it as ``<name>_prepacked``."""
    import tvm
    import tvm_ffi

    scheduled = scheduled_func(op, func, mod)
    if tvm_ffi.structural_equal(scheduled, func):
        return dataclasses.replace(op, key=False)
    prepacked = sum(bytes_of(new.shape, new.dtype) for new, old in zip(scheduled.params, func.params)
                    if [int(d) for d in new.shape] != [int(d) for d in old.shape])
    memory = schedule_memory(tvm.IRModule({"main": scheduled}), target, func, threads, op.outputs)
    memory[f"{MEM_PREFIX}prepacked"] = float(prepacked)
    return dataclasses.replace(op, latency_ms=measurer.time_primfunc(scheduled, target, Resources(threads)), memory=memory,
                               schedule=how, key=False)
