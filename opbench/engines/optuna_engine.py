"""Optuna as an engine: journal or RDB storage, batch ask/tell, failed trials told as failed, resumable."""
from __future__ import annotations

import contextlib
from typing import Any

from opbench.engines._base import Engine, Proposal, Space, split_threads
from opbench.engines.optuna_storage import open_storage
from opbench.exceptions import OpBenchError
from opbench.record import Record, is_ok

SAMPLERS = ("tpe", "random", "cmaes", "gp", "nsga2", "grid")


def _sampler(name: str, space: Space, seed: int | None) -> Any:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({k: v["_value"] for k, v in space.items()}, seed=seed)
    raise OpBenchError(f"unknown Optuna sampler '{name}'; samplers: {', '.join(SAMPLERS)}")


# Minimised; "threads" = cores used and "energy" = joules per call, for latency/resource Pareto fronts.
OBJECTIVES = ("latency", "threads", "energy")


class OptunaEngine(Engine):
    def __init__(self, space: Space, threads: int, study: str, storage: str, sampler: str = "tpe",
                 seed: int | None = None, resume: bool = False, initial: dict[str, Any] | None = None,
                 objectives: tuple[str, ...] = ("latency",)) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        unknown = [o for o in objectives if o not in OBJECTIVES]
        if unknown or not objectives or objectives[0] != "latency":
            raise OpBenchError(f"objectives must start with latency and be among {', '.join(OBJECTIVES)}; "
                               f"got {','.join(objectives)}")
        self.name = f"optuna-{sampler}"
        self.objectives = objectives
        self._space, self._threads = space, threads
        self._distributions: dict[str, optuna.distributions.BaseDistribution] = {
            k: optuna.distributions.CategoricalDistribution(v["_value"]) for k, v in space.items()}
        storage = open_storage(storage)
        if not resume:
            with contextlib.suppress(KeyError):
                optuna.delete_study(study_name=study, storage=storage)
        self.study = optuna.create_study(study_name=study, storage=storage, sampler=_sampler(sampler, space, seed),
                                         directions=["minimize"] * len(objectives), load_if_exists=True)
        if initial is not None and not self.study.trials:  # start a fresh study from the template default
            self.study.enqueue_trial({k: v for k, v in initial.items() if k in space})

    def recover(self, recorded: dict[str, Record]) -> list[Record]:
        """Settle trials a killed process left RUNNING: tell those whose record was written (keyed by
        ``engine_trial``), fail the rest and queue their params again, so nothing is lost or run twice.
        Returns the records it told."""
        import optuna

        told = []
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            record = recorded.get(str(trial.number))
            if record is not None:
                self.tell(Proposal({}, 0, optuna.trial.Trial(self.study, trial._trial_id)), record)
                told.append(record)
            else:
                self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                self.study.enqueue_trial(trial.params)
        return told

    @property
    def done(self) -> int:
        """Finished trials that were measured (a stale trial failed by :meth:`recover` has no status)."""
        import optuna

        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=finished) if "status" in t.user_attrs)

    def ask(self, n: int) -> list[Proposal]:
        out = []
        for _ in range(n):
            trial = self.study.ask(self._distributions)
            config, threads = split_threads(trial.params, self._threads)
            out.append(Proposal(config, threads, trial))
        return out

    def reject(self, proposal: Proposal, reason: str) -> None:
        """Fail the trial with a ``rejected`` attribute (no ``status``: not a measured trial, not counted)."""
        import optuna

        proposal.handle.set_user_attr("rejected", reason[:300])
        self.study.tell(proposal.handle, state=optuna.trial.TrialState.FAIL)

    def tell(self, proposal: Proposal, record: Record) -> None:
        import optuna

        trial = proposal.handle
        trial.set_user_attr("status", record["status"])
        trial.set_user_attr("trial_id", record["trial_id"])
        values = {"latency": record.get("latency_ms"), "threads": record["threads"], "energy": record.get("energy_j")}
        missing = [o for o in self.objectives if values[o] is None]
        if is_ok(record) and not missing:
            self.study.tell(trial, [values[o] for o in self.objectives])
        else:
            error = record.get("error", "") if not is_ok(record) else f"objective(s) not measured: {missing}"
            trial.set_user_attr("error", error[:500])
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def pareto_trial_ids(self) -> set[str]:
        """OpBench trial ids of the study's Pareto-optimal trials (the best one when single-objective)."""
        return {t.user_attrs["trial_id"] for t in self.study.best_trials if "trial_id" in t.user_attrs}
