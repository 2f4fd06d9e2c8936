"""Latency predictor: XGBoost on log time per unit of work from a record table's feature columns.

It learns log(latency / work) (inverse throughput) and multiplies the work back, the work being an operator's FLOPs,
or the bytes it moves where those are more (a model's reshape, pooling or copy): throughput transfers across
operators and sizes far better than raw latency (on a by-op split of 7 workloads, Spearman 0.68 instead of -0.2,
MAPE 0.63 instead of 1.13), since trees cannot extrapolate latency to an operator of another size; by FLOPs alone,
a copy's time per (zero) FLOP would be carried to operators that compute little.

``LatencyModel`` is a fit/predict class over DataFrames of records; ``split`` holds out rows at
random or whole groups (ops, thread counts, source models); ``evaluate`` gives MAPE, R² (of
log-latency), Spearman, the share within ±10% and TenSet's top-1/top-5 score per workload.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.record import FEATURE_PREFIX, Status

SPLITS = {"random": None, "by-op": "op", "by-threads": "threads", "by-model": "source_model"}
PER_STORE_PREFIX = "feat.ms"  # MetaSchedule's per-store features, averaged
BUILT_FEATURE_PREFIXES = (PER_STORE_PREFIX, "feat.asm_")  # those and the assembly's: known after a build
# One thread: XGBoost's OpenMP threads spin while they wait, and two trainings of two threads each on two cores
# ran 10-100x slower than one after the other (the suite's two ranker tests: 3 s apart, 37-441 s together).
XGB_THREADS = 1
# A label whose own record's repeats varied more than this (latency_cv) was taken while the host was busy: it is
# neither trained on nor scored.
MAX_LABEL_CV = 0.1


def trainable(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with a measured latency that their own record does not call noisy (``latency_cv`` at most
    :data:`MAX_LABEL_CV` where it is known)."""
    if "status" not in frame or "latency_ms" not in frame:
        raise OpBenchError("the dataset has no 'status'/'latency_ms' columns: is it an OpBench record table?")
    steady = ~frame["latency_cv"].gt(MAX_LABEL_CV) if "latency_cv" in frame else True
    return frame[(frame["status"] == Status.OK.value) & frame["latency_ms"].gt(0) & steady].reset_index(drop=True)


def feature_columns(frame: pd.DataFrame, static_only: bool = False) -> list[str]:
    """``feat.*`` columns (without MetaSchedule's per-store ones and the assembly's when ``static_only``: those need
    a schedule and a build)."""
    return [c for c in frame.columns if c.startswith(FEATURE_PREFIX)
            and not (static_only and c.startswith(BUILT_FEATURE_PREFIXES))]


FLOPS_FEATURE, BYTES_FEATURE = "feat.flops", "feat.bytes"


def task_keys(frame: pd.DataFrame) -> pd.Series:
    """Each row's canonical task (its ``task_key``; records made before they carried one: from their
    workload where it parses, else the workload's name)."""
    from opbench.workloads import task_key_of

    known = frame["task_key"] if "task_key" in frame else pd.Series(None, frame.index, dtype=object)
    names = frame["workload"].astype(str)
    return pd.Series([k if isinstance(k, str) and k else task_key_of(w) or w for k, w in zip(known, names)], frame.index)


def work_scale(frame: pd.DataFrame) -> np.ndarray:
    """Per-row normaliser of latency: the op's FLOPs or the bytes it moves, whichever is more (1 where unknown)."""
    work = frame.reindex(columns=[FLOPS_FEATURE, BYTES_FEATURE]).astype("float64").fillna(1.0).to_numpy()
    return np.maximum(work.max(axis=1), 1.0)


class LatencyModel:
    """XGBoost regression of log(latency_ms / work) (:func:`work_scale`) on feature columns; predicts latency in ms."""

    def __init__(self, columns: Sequence[str] | None = None, seed: int = 0, n_estimators: int = 300) -> None:
        self.columns: list[str] = list(columns) if columns is not None else []
        self.seed, self.n_estimators = seed, n_estimators
        self.booster: Any = None  # an xgboost.XGBRegressor once fitted or loaded

    def _matrix(self, frame: pd.DataFrame) -> np.ndarray:
        return frame.reindex(columns=self.columns).astype("float64").to_numpy()

    def _scale(self, frame: pd.DataFrame) -> np.ndarray | float:
        return work_scale(frame) if FLOPS_FEATURE in self.columns else 1.0

    def fit(self, frame: pd.DataFrame, weights: np.ndarray | None = None) -> LatencyModel:
        """Fit on ``frame``'s measured rows; ``weights``: one per row of ``frame``, which must then all be measured."""
        import xgboost as xgb

        rows = trainable(frame)
        if len(rows) < 2:
            raise OpBenchError(f"need at least 2 measured trials to train, got {len(rows)}")
        if weights is not None and len(weights) != len(rows):
            raise OpBenchError(f"{len(weights)} weights for {len(rows)} measured rows ({len(frame)} given)")
        self.columns = self.columns or feature_columns(rows)
        model = xgb.XGBRegressor(n_estimators=self.n_estimators, max_depth=6, learning_rate=0.08, subsample=0.9,
                                 colsample_bytree=0.8, random_state=self.seed, n_jobs=XGB_THREADS)
        model.fit(self._matrix(rows), np.log(rows["latency_ms"].to_numpy() / self._scale(rows)), sample_weight=weights)
        self.booster = model
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        if self.booster is None:
            raise OpBenchError("the predictor is not trained")
        return np.exp(self.booster.predict(self._matrix(frame))) * self._scale(frame)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(folder / "model.json")
        (folder / "columns.json").write_text(json.dumps(self.columns))

    @classmethod
    def load(cls, folder: Path | str) -> LatencyModel:
        import xgboost as xgb

        folder = Path(folder)
        if not (folder / "model.json").is_file():
            raise OpBenchError(f"{folder}: no saved predictor (model.json) there")
        model = cls(json.loads((folder / "columns.json").read_text()))
        model.booster = xgb.XGBRegressor()
        model.booster.load_model(folder / "model.json")
        return model


def split(frame: pd.DataFrame, how: str, seed: int = 0, test_size: float = 0.25) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train/test rows: at random, or holding out whole groups (ops, thread counts, models)."""
    from sklearn.model_selection import GroupShuffleSplit, ShuffleSplit

    if how not in SPLITS:
        raise OpBenchError(f"unknown split '{how}'; splits: {', '.join(SPLITS)}")
    rows = trainable(frame)
    column = SPLITS[how]
    if column is None:
        train, test = next(ShuffleSplit(1, test_size=test_size, random_state=seed).split(rows))
    else:
        groups = rows[column].fillna("").astype(str)
        if groups.nunique() < 2:
            raise OpBenchError(f"split {how} needs at least 2 distinct '{column}' values, the data has "
                               f"{groups.nunique()}")
        train, test = next(GroupShuffleSplit(1, test_size=test_size, random_state=seed).split(rows, groups=groups))
    return rows.iloc[train].reset_index(drop=True), rows.iloc[test].reset_index(drop=True)


def top_k_score(frame: pd.DataFrame, predicted: np.ndarray, k: int) -> float:
    """TenSet's top-k: per workload, best latency / latency of the best of the k predicted fastest; mean."""
    scores = []
    ranked = pd.DataFrame({"workload": frame["workload"].to_numpy(), "latency_ms": frame["latency_ms"].to_numpy(),
                           "_pred": predicted})
    for _, group in ranked.groupby("workload"):
        chosen = group.nsmallest(k, "_pred")["latency_ms"].min()
        scores.append(group["latency_ms"].min() / chosen)
    return float(np.mean(scores)) if scores else math.nan


def evaluate(model: LatencyModel, frame: pd.DataFrame) -> dict[str, float]:
    from scipy.stats import spearmanr

    rows = trainable(frame)
    if rows.empty:
        raise OpBenchError("no measured trials to evaluate on")
    true, pred = rows["latency_ms"].to_numpy(), model.predict(rows)
    log_true, log_pred = np.log(true), np.log(pred)
    ss_res, ss_tot = float(np.sum((log_true - log_pred) ** 2)), float(np.sum((log_true - log_true.mean()) ** 2))
    ratio = np.abs(pred / true - 1)
    return {
        "n": float(len(rows)),
        "mape": float(np.mean(ratio)),
        "r2_log": 1 - ss_res / ss_tot if ss_tot > 0 else math.nan,
        "spearman": float(spearmanr(true, pred).statistic) if len(rows) > 2 else math.nan,
        "within_10pct": float(np.mean(ratio <= 0.10)),
        "top1": top_k_score(rows, pred, 1),
        "top5": top_k_score(rows, pred, 5),
    }
