"""Tuned schedules of a model's operators as a MetaSchedule database, and the model built with it.

Each tuned operator's best config is replayed on a ``tvm.s_tir.Schedule`` of its PrimFunc; the
schedule's trace is a MetaSchedule tuning record for that PrimFunc (``database_workload.json`` +
``database_tuning_record.json``). Relax's ``MetaScheduleApplyDatabase`` then swaps the schedules
into the fused model before it is built, exactly as a MetaSchedule-tuned model is.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench._tvm_compat import light_tensor_intrin
from opbench.space import Config, Template, get_template, winograd_fused
from opbench.workloads import Workload

PREPACKED_SUFFIX = "_prepacked"  # SplitLayoutRewritePreproc's name for an operator taking its packed weight
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # a MetaSchedule JSON database's


@dataclass
class TunedOp:
    workload: Workload
    template: Template
    config: Config
    latency_ms: float


def default_op(workload: Workload, latency_ms: float) -> TunedOp:
    """``workload``'s template default as a tuned operator measured at ``latency_ms``."""
    template = get_template(workload)
    return TunedOp(workload, template, template.validate(template.default_config(workload), workload), latency_ms)


def is_default(op: TunedOp) -> bool:
    """Whether ``op`` runs its template's default schedule."""
    return op.config == default_op(op.workload, op.latency_ms).config


def write_database(folder: Path, tuned: list[TunedOp], target: Any) -> Any:
    """A MetaSchedule JSON database in ``folder`` holding one record per tuned operator."""
    light_tensor_intrin()
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    folder.mkdir(parents=True, exist_ok=True)
    for name in DATABASE_FILES:
        (folder / name).unlink(missing_ok=True)
    database = ms.database.JSONDatabase(*(str(folder / name) for name in DATABASE_FILES))
    for op in tuned:
        func = op.workload.prim_func().with_attr("tirx.noalias", True)
        mod = tvm.IRModule({"main": func})
        sch = s_tir.Schedule(mod)
        op.template.apply(sch, op.config, op.workload)
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, database.commit_workload(mod), [op.latency_ms / 1e3], target,
            ms.arg_info.ArgInfo.from_prim_func(func)))
    return database


def apply_database(mod: Any, database: Any, target: Any) -> Any:
    """The fused Relax module with every PrimFunc the database knows replaced by its tuned schedule (or, where
    the record marks a Winograd config, by the Winograd rebuild: :mod:`opbench.space.winograd_fused`), and the
    weight layout rewrites those mark (packed convolutions', Winograd's weight transform) computed at build time:
    split into functions of their own and folded on the model's constant weights."""
    light_tensor_intrin()
    import tvm
    from tvm import relax

    with target, database:
        mod = winograd_fused.rebuild_marked(relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod))
    with target:
        return tvm.ir.transform.Sequential([relax.transform.SplitLayoutRewritePreproc(),
                                            relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()])(mod)


def prepacked(mod: Any) -> list[str]:
    """The PrimFuncs of a built module that take weights packed at build time (``*_prepacked``)."""
    return sorted(g.name_hint for g in mod.functions if g.name_hint.endswith(PREPACKED_SUFFIX))
