"""Predictors that rank the configs of one task instead of predicting its latency (the contract:
``fit(frame)`` on record rows, ``predict(frame)`` a score ordered as latency: lower is predicted faster).

A held-out task's best config is chosen by order alone, so a model need not learn how fast one task runs
against another (TLP ranks within a task; MetaSchedule's XGBModel labels ``min_cost / cost`` per
workload). Objectives, grouped by canonical task (:func:`opbench.predictor.model.task_keys`):
``normalised`` regresses log(latency / the task's best latency); ``pairwise`` is XGBoost's
``rank:pairwise`` on the task's relative throughput (best latency / latency). Two aim at a task's fastest
configs, as a top-1 pick needs: ``capped`` regresses the same slowdown capped at :data:`CAP`, each row weighted
by its relative throughput (how slow a slow config is does not pick the best); ``graded`` is ``pairwise`` on
slowdowns binned in steps of :data:`GRADE` (configs within one step are not ordered against each other, so
their measurement noise is not learnt).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.predictor.model import XGB_THREADS, feature_columns, task_keys, trainable

OBJECTIVES = ("normalised", "pairwise", "capped", "graded")
RANKING_OBJECTIVES = ("pairwise", "graded")  # XGBoost rankers: a higher score is faster
CAP = 3.0  # "capped": a slowdown beyond this counts as this
GRADE = 1.1  # "graded": slowdowns binned in steps of this ratio
# chosen on held-out development workloads (benchmarks/predictor_heldout.py; docs/cli.md#predictor)
TREE = {"n_estimators": 600, "max_depth": 6, "learning_rate": 0.05, "subsample": 0.9, "colsample_bytree": 0.8,
        "n_jobs": XGB_THREADS}


def task_labels(objective: str, relative: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """An objective's training labels and row weights (None: equal) from each row's relative throughput (its
    task's best latency / its latency, 1 for the best)."""
    slowdown = -np.log(relative)
    if objective == "pairwise":
        return relative, None
    if objective == "graded":
        return -np.floor(slowdown / np.log(GRADE) + 1e-9), None  # + 1e-9: exactly n steps is step n, not n - 1
    if objective == "capped":
        return np.minimum(slowdown, np.log(CAP)), relative
    return slowdown, None


class TaskRanker:
    """XGBoost on feature columns, trained on each task's configs relative to that task's best."""

    def __init__(self, objective: str = "pairwise", seed: int = 0, without: tuple[str, ...] = ()) -> None:
        """``without``: prefixes of feature columns left out."""
        if objective not in OBJECTIVES:
            raise OpBenchError(f"unknown ranking objective '{objective}'; objectives: {', '.join(OBJECTIVES)}")
        self.objective, self.seed, self.without = objective, seed, without
        self.columns: list[str] = []
        self.booster: Any = None

    def fit(self, frame: pd.DataFrame) -> TaskRanker:
        import xgboost as xgb

        rows = trainable(frame)
        if len(rows) < 2:
            raise OpBenchError(f"need at least 2 measured trials to train, got {len(rows)}")
        tasks = task_keys(rows).to_numpy()
        order = np.argsort(tasks, kind="stable")  # a task's rows together, as a ranker's groups must be
        rows, tasks = rows.iloc[order].reset_index(drop=True), tasks[order]
        self.columns = [c for c in feature_columns(rows) if not c.startswith(self.without)]
        latency = rows["latency_ms"]
        label, weight = task_labels(self.objective, (latency.groupby(tasks).transform("min") / latency).to_numpy())
        if self.objective in RANKING_OBJECTIVES:
            self.booster = xgb.XGBRanker(objective="rank:pairwise", random_state=self.seed, **TREE)
            self.booster.fit(self._matrix(rows), label, qid=pd.factorize(tasks)[0])
        else:
            self.booster = xgb.XGBRegressor(random_state=self.seed, **TREE)
            self.booster.fit(self._matrix(rows), label, sample_weight=weight)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """A score per row, lower for configs predicted faster within their task (not comparable across tasks)."""
        if self.booster is None:
            raise OpBenchError("the predictor is not trained")
        score = self.booster.predict(self._matrix(frame))
        return -score if self.objective in RANKING_OBJECTIVES else score

    def _matrix(self, frame: pd.DataFrame) -> np.ndarray:
        return frame.reindex(columns=self.columns).astype("float64").to_numpy()


class RankerEnsemble:
    """Rankers trained on the same rows (each on its own feature columns) whose scores, each standardised
    within its task, are summed: a pairwise ranker learns each task's order and the normalised regression how
    far each config is from the task's best, and where one is unsure of the order of a task's fastest configs
    the others break the tie."""

    def __init__(self, members: list[TaskRanker]) -> None:
        self.members = members

    @property
    def columns(self) -> list[str]:
        """The feature columns any member was trained on."""
        return sorted(set().union(*(member.columns for member in self.members)))

    def fit(self, frame: pd.DataFrame) -> RankerEnsemble:
        for member in self.members:
            member.fit(frame)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """A score per row, lower for configs predicted faster within their task."""
        tasks = task_keys(frame).to_numpy()
        total = np.zeros(len(frame))
        for member in self.members:
            score = pd.Series(member.predict(frame), index=frame.index).groupby(tasks)
            total += ((score.obj - score.transform("mean")) / (score.transform("std", ddof=0) + 1e-12)).to_numpy()
        return total
