"""MetaSchedule tuning a whole model with a global trial budget, as a TVM user would run it (its own builder,
runner, evolutionary search, XGBoost cost model and task scheduler, a fixed seed): the baseline at equal trials."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench._tvm_compat import light_tensor_intrin
from opbench.measure.models import export_model
from opbench.studies.models.tuned import apply_database

SEED = 0
BUILD_TIMEOUT_S = 120.0  # a candidate's build, importing TVM in the builder's worker included


@dataclass
class MetaScheduleModel:
    library: Path  # the model built with MetaSchedule's best schedules
    trials: int  # its global budget: candidates built and timed
    tasks: int
    untuned_tasks: int  # tasks the budget left without a measured schedule (TVM's default lowering)

    @property
    def note(self) -> str:
        return f"{self.trials} trials; {self.untuned_tasks} of {self.tasks} tasks untuned"


def metaschedule_model(mod: Any, target: Any, folder: Path, trials: int) -> MetaScheduleModel:
    """``tune_relax`` on the fused model ``mod`` with ``trials`` trials in all, then the model built with
    the database it wrote (exported in ``folder``)."""
    light_tensor_intrin()
    from tvm.s_tir import meta_schedule as ms

    work = folder / "metaschedule"
    tasks = ms.relax_integration.extract_tasks(mod, target)
    builder = ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_S, initializer=light_tensor_intrin)
    database = ms.relax_integration.tune_relax(mod, {}, target, str(work), max_trials_global=trials, seed=SEED,
                                               builder=builder)
    untuned = sum(database.query_tuning_record(task.dispatched[0], target, "main") is None for task in tasks)
    library = export_model(apply_database(mod, database, target), target, folder / "metaschedule.so")
    return MetaScheduleModel(library, trials, len(tasks), untuned)
