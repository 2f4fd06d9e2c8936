"""Predictors that rank the configs of one task instead of predicting its latency (the contract:
``fit(frame)`` on record rows, ``predict(frame)`` a score ordered as latency: lower is predicted faster).

A held-out task's best config is chosen by order alone, so a model need not learn how fast one task runs
against another (TLP ranks within a task; MetaSchedule's XGBModel labels ``min_cost / cost`` per
workload). Two objectives, grouped by canonical task (:func:`opbench.predictor.model.task_keys`):
``normalised`` regresses log(latency / the task's best latency); ``pairwise`` is XGBoost's
``rank:pairwise`` on the task's relative throughput (best latency / latency).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.predictor.model import XGB_THREADS, feature_columns, task_keys, trainable

OBJECTIVES = ("normalised", "pairwise")
TREE = {"n_estimators": 300, "max_depth": 6, "learning_rate": 0.08, "subsample": 0.9, "colsample_bytree": 0.8,
        "n_jobs": XGB_THREADS}


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
        rows = rows.assign(_task=task_keys(rows).to_numpy()).sort_values("_task", kind="stable")
        self.columns = [c for c in feature_columns(rows) if not c.startswith(self.without)]
        relative = rows.groupby("_task")["latency_ms"].transform("min") / rows["latency_ms"]  # 1 for a task's best
        if self.objective == "pairwise":
            self.booster = xgb.XGBRanker(objective="rank:pairwise", random_state=self.seed, **TREE)
            self.booster.fit(self._matrix(rows), relative.to_numpy(), qid=pd.factorize(rows["_task"])[0])
        else:
            self.booster = xgb.XGBRegressor(random_state=self.seed, **TREE)
            self.booster.fit(self._matrix(rows), -np.log(relative.to_numpy()))
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """A score per row, lower for configs predicted faster within their task (not comparable across tasks)."""
        if self.booster is None:
            raise OpBenchError("the predictor is not trained")
        score = self.booster.predict(self._matrix(frame))
        return -score if self.objective == "pairwise" else score

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
