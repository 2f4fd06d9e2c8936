"""MetaSchedule tuning a whole model with a global trial budget, as a TVM user would run it (its own builder,
runner, evolutionary search, XGBoost cost model and gradient task scheduler, a fixed seed): the baseline at
equal trials. The budget is spread so that every task gets a round before any gets a second one."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench._tvm_compat import light_tensor_intrin
from opbench.measure.models import export_model
from opbench.space.dot_product import repair_tvm_vnni
from opbench.studies.models.reuse import TunedCache
from opbench.studies.models.tuned import apply_database

SEED = 0
MAX_TRIALS_PER_ITER = 64  # tune_relax's default round
BUILD_TIMEOUT_S = 120.0  # a candidate's build, importing TVM in the builder's worker included


@dataclass
class MetaScheduleModel:
    library: Path  # the model built with MetaSchedule's best schedules
    trials: int  # its global budget: candidates built and timed
    tasks: int
    untuned_tasks: int  # tasks the budget left without a measured schedule (TVM's default lowering)

    @property
    def note(self) -> str:
        return (f"{self.trials} trials, {trials_per_round(self.trials, self.tasks)} a task's round; "
                f"{self.untuned_tasks} of {self.tasks} tasks untuned")


def trials_per_round(trials: int, tasks: int) -> int:
    """Trials of one task's round (``num_trials_per_iter``): the gradient scheduler gives each task one round
    first, so a budget of ``trials`` reaches every one of ``tasks`` when it is at least one per task;
    at most :data:`MAX_TRIALS_PER_ITER`."""
    return max(1, min(MAX_TRIALS_PER_ITER, trials // max(1, tasks)))


def metaschedule_model(mod: Any, target: Any, folder: Path, trials: int, cache: TunedCache | None = None
                       ) -> MetaScheduleModel:
    """MetaSchedule's tasks of the fused model ``mod`` tuned with ``trials`` trials in all (as ``tune_relax``
    tunes them, rounds of :func:`trials_per_round`), then the model built with the database it wrote
    (exported in ``folder``); the database of a run with ``cache``'s key and budget is reused, and kept."""
    light_tensor_intrin()
    repair_tvm_vnni()  # MetaSchedule's int8 rule on a VNNI target
    from tvm.s_tir import meta_schedule as ms

    work = folder / "metaschedule"
    tasks = ms.relax_integration.extract_tasks(mod, target)
    kept = cache.metaschedule(trials) if cache else None
    if kept is not None:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(kept, work)
        database = ms.database.JSONDatabase(work_dir=str(work))
    else:
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(work), seed=SEED)
        builder = ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_S, initializer=light_tensor_intrin)
        database = ms.tune.tune_tasks(tasks=contexts, task_weights=weights, work_dir=str(work), max_trials_global=trials,
                                      num_trials_per_iter=trials_per_round(trials, len(tasks)), builder=builder)
        if cache is not None:
            cache.save_metaschedule(trials, work)
    untuned = sum(database.query_tuning_record(task.dispatched[0], target, "main") is None for task in tasks)
    library = export_model(apply_database(mod, database, target), target, folder / "metaschedule.so")
    return MetaScheduleModel(library, trials, len(tasks), untuned)
