"""The engine registry: which engines exist and how one is made for a workload's space.

Used alike by ``opbench tune``, the studies and the benchmarks. Most engines propose configs one by
one (:func:`create_engine`); ``metaschedule`` owns its search loop (:func:`create_loop_engine`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opbench.engines._base import Engine, LoopEngine, Space
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.paths import store_dir
from opbench.space import Template
from opbench.workloads import Workload

ENGINES = ("optuna", "nni", "random", "grid", "model", "metaschedule")
LOOP_ENGINES = ("metaschedule",)  # engines that run their own search loop rather than ask/tell


@dataclass(frozen=True)
class EngineSpec:
    """Which engine proposes configs, and its own settings."""

    name: str = "optuna"
    sampler: str = "tpe"  # optuna: tpe, random, cmaes, gp, nsga2, grid
    tuner: str = "TPE"  # nni: an NNI built-in tuner
    seed: int | None = None
    storage: str | None = None  # optuna: a journal file or a database URL (default: the store's journal)
    objectives: tuple[str, ...] = ("latency",)  # optuna: more than one gives a Pareto front
    warm_start: str | Path | None = None  # model: a dataset of earlier logs to train its first predictor on

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise OpBenchError(f"unknown engine '{self.name}'; engines: {', '.join(ENGINES)}")
        if len(self.objectives) > 1 and self.name != "optuna":
            raise OpBenchError(f"objectives (--objectives) {','.join(self.objectives)} need the optuna engine "
                               "(sampler nsga2, gp or tpe)")

    @property
    def label(self) -> str:
        """The name a study's records carry as ``engine``: optuna-tpe, nni-anneal, random, ..."""
        if self.name == "optuna":
            return f"optuna-{self.sampler}"
        if self.name == "nni":
            return f"nni-{self.tuner.lower()}"
        return self.name


def create_engine(spec: EngineSpec, space: Space, workload: Workload, template: Template, resources: Resources,
                  study: str, resume: bool = False, budget: int | None = None) -> Engine:
    """An ask/tell engine over ``space`` (a thread count in the space overrides ``resources.threads``);
    an Optuna study given a ``budget`` stops at that many measured trials, whoever measures them. The tuning
    loop gives a fresh study the template default first (:func:`opbench.engines.loop.run_tuning`)."""
    threads = resources.threads
    if spec.name == "optuna":
        from opbench.engines.optuna.engine import OptunaEngine
        from opbench.engines.optuna.storage import default_storage

        storage = spec.storage or default_storage(store_dir())
        return OptunaEngine(space, threads, study, storage, spec.sampler, spec.seed, resume,
                            objectives=spec.objectives, budget=budget)
    if spec.name == "nni":
        from opbench.engines.nni.engine import NniEngine

        return NniEngine(spec.tuner, space, threads, spec.seed)
    if spec.name == "random":
        from opbench.engines.simple import RandomEngine

        return RandomEngine(space, threads, spec.seed)
    if spec.name == "grid":
        from opbench.engines.simple import GridEngine

        return GridEngine(space, threads)
    if spec.name == "model":
        from opbench.engines.model_engine import ModelEngine
        from opbench.tracking.dataset import read_dataset

        warm = read_dataset(spec.warm_start) if spec.warm_start else None
        return ModelEngine(space, resources, workload, template, spec.seed, warm)
    raise OpBenchError(f"engine '{spec.name}' runs its own search loop; engines proposing configs one by one: "
                       f"{', '.join(e for e in ENGINES if e not in LOOP_ENGINES)}")


def create_loop_engine(spec: EngineSpec, work_dir: Path) -> LoopEngine:
    """An engine that runs its own search loop, keeping its state in ``work_dir`` (started afresh)."""
    if spec.name != "metaschedule":
        raise OpBenchError(f"engine '{spec.name}' proposes configs one by one; engines with their own loop: "
                           f"{', '.join(LOOP_ENGINES)}")
    import shutil

    from opbench.engines.metaschedule import MetaScheduleTuner

    shutil.rmtree(work_dir, ignore_errors=True)  # a fresh search, not warm-started from an old database
    return MetaScheduleTuner(work_dir, spec.seed)
