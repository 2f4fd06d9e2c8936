"""The predictor scored as TenSet and TLP score theirs: on groups it never saw (``opbench predictor study``).

Rows are grouped by what is held out: a canonical task (``task_key``: every name of one computation is
one workload), an op kind, or a source model. Each fold trains one model on the other groups' ok rows
and scores the held-out ones task by task: top-k = best latency / the best latency among the k predicted
fastest; a random pick's expected top-k is :func:`random_top_k`. Two summaries: TenSet's, the mean of the
groups' scores, and TLP's, pooled: Σ best latency / Σ latency of the top-k pick over every task.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.predictor import PREDICTORS
from opbench.predictor.model import PER_STORE_PREFIX, LatencyModel, task_keys, trainable
from opbench.predictor.ranking import OBJECTIVES, RankerEnsemble, TaskRanker

HOLD_OUTS = {"workload": "task_key", "op": "op", "model": "source_model", "device": "device_key"}
TOP_K = (1, 5)


def random_top_k(latencies: np.ndarray | list[float], k: int) -> float:
    """A random pick of k rows' expected top-k: with l1 <= ... <= ln, Σi (l1/li)·C(n−i, k−1)/C(n, k)
    (the i-th fastest is the best of the k picked with that probability)."""
    values = np.sort(np.asarray(latencies, dtype="float64"))
    n = len(values)
    k = min(k, n)
    total = math.comb(n, k)
    return float(sum(values[0] / values[i - 1] * math.comb(n - i, k - 1) / total for i in range(1, n - k + 2)))


def pick(latencies: np.ndarray, predicted: np.ndarray, k: int) -> float:
    """The latency of the fastest among the k rows predicted fastest."""
    return float(latencies[np.argsort(predicted, kind="stable")[:k]].min())


@dataclass
class TaskScore:
    group: str
    task: str
    seed: int
    rows: int
    best: float  # ms
    picked: dict[int, float]  # k -> latency of the top-k pick (ms)
    random: dict[int, float]  # k -> a random pick's expected top-k
    spearman: float
    weight: float = 1.0
    abs_pct_error: float = math.nan  # the mean over its rows of |predicted - measured| / measured (a latency model's)

    def top(self, k: int) -> float:
        return self.best / self.picked[k]


@dataclass
class HeldOutResult:
    hold_out: str
    folds: list[list[str]]  # the held-out groups of each fold
    scores: list[TaskScore] = field(default_factory=list)

    @classmethod
    def joined(cls, parts: Sequence[HeldOutResult]) -> HeldOutResult:
        """One result of studies of the same folds run apart (e.g. one seed each, in parallel)."""
        if not parts or any((part.hold_out, part.folds) != (parts[0].hold_out, parts[0].folds) for part in parts):
            raise OpBenchError("only studies of the same hold-out and folds join into one result")
        return cls(parts[0].hold_out, parts[0].folds, [score for part in parts for score in part.scores])

    def by_group(self) -> pd.DataFrame:
        """Per held-out group (over its tasks and seeds, weighted): top-k, Spearman, a random pick's top-k."""
        rows = []
        for group in sorted({s.group for s in self.scores}):
            mine = [s for s in self.scores if s.group == group]
            weights = np.array([s.weight for s in mine])
            tasks = {s.task: s.rows for s in mine}  # each seed scores the same rows
            row: dict[str, Any] = {"group": group, "tasks": len(tasks), "rows": sum(tasks.values())}
            for k in TOP_K:
                row[f"top{k}"] = float(np.average([s.top(k) for s in mine], weights=weights))
                row[f"random_top{k}"] = float(np.average([s.random[k] for s in mine], weights=weights))
            row["spearman"] = float(np.nanmean([s.spearman for s in mine]))
            rows.append(row)
        return pd.DataFrame(rows)

    def summaries(self) -> dict[str, float]:
        """TenSet's (the mean of the groups' scores) and TLP's (pooled over every task) top-k, and the mean absolute
        percentage error over every row (``mape``: meaningful where the predictor predicts latency in ms)."""
        groups = self.by_group()
        out: dict[str, float] = {}
        for k in TOP_K:
            out[f"tenset_top{k}"] = float(groups[f"top{k}"].mean())
            out[f"tlp_top{k}"] = sum(s.best * s.weight for s in self.scores) / sum(s.picked[k] * s.weight for s in self.scores)
            out[f"random_top{k}"] = float(groups[f"random_top{k}"].mean())
        out["below_random"] = float((groups["top1"] < groups["random_top1"]).sum())
        out["mape"] = float(np.average([s.abs_pct_error for s in self.scores], weights=[s.rows for s in self.scores]))
        return out


def groups_of(frame: pd.DataFrame, hold_out: str) -> pd.Series:
    """Each row's group for ``hold_out`` (workload: its canonical task key)."""
    if hold_out not in HOLD_OUTS:
        raise OpBenchError(f"unknown hold-out '{hold_out}'; hold-outs: {', '.join(HOLD_OUTS)}")
    column = HOLD_OUTS[hold_out]
    if column == "task_key":
        return task_keys(frame)
    if column not in frame:
        raise OpBenchError(f"--hold-out {hold_out} needs a '{column}' column, the dataset has none")
    return frame[column].fillna("").astype(str)


def make_folds(groups: list[str], folds: int | None, seed: int = 0) -> list[list[str]]:
    """Leave one group out (``folds`` None), or the groups shuffled into ``folds`` folds."""
    unique = sorted(set(groups))
    if len(unique) < 2:
        raise OpBenchError(f"a held-out study needs at least 2 groups, the data has {len(unique)}")
    if folds is None or folds >= len(unique):
        return [[g] for g in unique]
    if folds < 2:
        raise OpBenchError(f"--folds must be at least 2, got {folds}")
    order = list(np.random.default_rng(seed).permutation(unique))
    return [sorted(str(g) for g in order[i::folds]) for i in range(folds)]


Predictor = LatencyModel | TaskRanker | RankerEnsemble


ENSEMBLES = {"ensemble-compiled": ("normalised", "pairwise"),  # (the regression, the ranker)
             "ensemble-capped": ("capped", "pairwise"),  # the regression aimed at a task's fastest configs
             "ensemble-near-best": ("capped", "graded")}  # both members aimed there


def compiled_ensemble(regression: str, ranking: str, seed: int) -> RankerEnsemble:
    """A regression and a ranker on the compiled kernel's features (without MetaSchedule's per-store means, as
    pairwise-compiled) and the ranker with the means, their scores summed."""
    compiled = (PER_STORE_PREFIX,)
    return RankerEnsemble([TaskRanker(regression, seed, without=compiled), TaskRanker(ranking, seed, without=compiled),
                           TaskRanker(ranking, seed)])


def predictor(name: str) -> Callable[[int], Predictor]:
    """A seed's untrained predictor of kind ``name`` (:data:`PREDICTORS`)."""
    if name == "latency":
        return lambda seed: LatencyModel(seed=seed)
    if name in OBJECTIVES:
        return lambda seed: TaskRanker(name, seed)
    if name == "pairwise-compiled":
        return lambda seed: TaskRanker("pairwise", seed, without=(PER_STORE_PREFIX,))
    if name in ENSEMBLES:
        return lambda seed: compiled_ensemble(*ENSEMBLES[name], seed)
    raise OpBenchError(f"unknown predictor '{name}'; predictors: {', '.join(PREDICTORS)}")


def held_out_study(frame: pd.DataFrame, hold_out: str, folds: int | None = None, seeds: int | Sequence[int] = 1,
                   model: Callable[[int], Predictor] | None = None,
                   fixed_folds: list[list[str]] | None = None, few_shot: int = 0) -> HeldOutResult:
    """Train a model per fold and seed (``model(seed)``, by default :class:`LatencyModel`) on every group but
    the fold's, score the fold's tasks; the folds are ``fixed_folds`` when given (e.g. one fold of workloads
    set aside), else :func:`make_folds`'s; ``seeds``: how many (0, 1, ...), or which. ``few_shot`` rows of each
    held-out group, drawn at random per seed, join the training set and leave the scored ones (a new device
    fine-tuned with k of its measurements, as CDMPP and MTL-TLP do; 0: zero-shot)."""
    model = model or predictor("latency")
    rows = trainable(frame).copy()  # one block: a frame merged column by column warns on every assign
    rows = rows.assign(_group=groups_of(rows, hold_out).to_numpy(), _task=groups_of(rows, "workload").to_numpy())
    if rows["_group"].nunique() < 2 and not fixed_folds:
        raise OpBenchError(f"--hold-out {hold_out} needs two groups or more; the dataset holds one "
                           f"({rows['_group'].iloc[0] if len(rows) else 'none'}): nothing to train on for it")
    result = HeldOutResult(hold_out, fixed_folds or make_folds(list(rows["_group"]), folds))
    for seed in range(seeds) if isinstance(seeds, int) else seeds:
        for held in result.folds:
            train, test = rows[~rows["_group"].isin(held)], rows[rows["_group"].isin(held)]
            if few_shot:
                shots = pd.concat([group.sample(n=min(few_shot, len(group) - 1), random_state=seed)
                                   for _, group in test.groupby("_group")])  # each keeps a row to score at least
                train, test = pd.concat([train, shots]), test.drop(shots.index)
            fitted = model(seed).fit(train.drop(columns=["_group", "_task"]))
            test = test.assign(_pred=fitted.predict(test.drop(columns=["_group", "_task"])))
            result.scores += [_task_score(task, seed, hold_out) for _, task in test.groupby(["_group", "_task"])]
    return result


def _task_score(task: pd.DataFrame, seed: int, hold_out: str) -> TaskScore:
    from scipy.stats import spearmanr

    latencies, predicted = task["latency_ms"].to_numpy(), task["_pred"].to_numpy()
    rho = float(spearmanr(latencies, predicted).statistic) if len(task) > 2 else math.nan
    weight = float(task["share"].mean()) if hold_out == "model" and "share" in task and task["share"].notna().any() else 1.0
    return TaskScore(str(task["_group"].iloc[0]), str(task["_task"].iloc[0]), seed, len(task), float(latencies.min()),
                     {k: pick(latencies, predicted, k) for k in TOP_K}, {k: random_top_k(latencies, k) for k in TOP_K},
                     rho, weight, float(np.mean(np.abs(predicted - latencies) / latencies)))
