"""A whole model's latency from its fused operators' predicted latencies and call counts (issue 95 #3).

Operators timed alone do not add up to the model they make; the composition of their sum is learned from other
models: measured ≈ ``a`` x (sum over the
operators of calls x predicted ms) + ``b`` x (operator calls), ``a, b >= 0`` (non-negative least squares): ``a`` the
share of an operator's time alone that it keeps inside the model (its inputs warm from the operator before, its
weights cold), ``b`` the Relax VM's cost of one call (or ``b`` measured, :mod:`opbench.studies.models.call_cost`,
and ``a`` alone fitted).

:func:`leave_one_model_out` scores it as a held-out study: for each model, the operator predictor is trained on the
catalogue records and the other models' operators, and the composition on the other models' operators as measured.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import HostFacts, Resources
from opbench.measure.features import static_features
from opbench.space import Config
from opbench.workloads import OPERATORS, Workload

MODEL_COLUMN, CALLS_COLUMN = "source_model", "calls"  # an operator row's model, and how often the model calls it
ANCHOR_KINDS = {"pool": "pool2d"}  # a fused operator's anchor kind where the catalogue names that operator otherwise

# A predictor trained on a record table: fit(frame) -> predict(frame) -> ms
TrainPredictor = Callable[[pd.DataFrame], Callable[[pd.DataFrame], np.ndarray]]


def operator_features(workload: Workload, kind: str, config: Config, template: str | None, resources: Resources,
                      host: HostFacts) -> dict[str, float]:
    """A model operator's features as a predictor takes them: :func:`static_features`, the operator also flagged
    as the catalogue operator it anchors on (a fused convolution as ``conv2d``), so catalogue records inform it."""
    features = static_features(workload, config, template, resources, host)
    anchor = anchor_operator(workload, kind)
    if anchor is not None:
        features[f"feat.op_{anchor}"] = 1.0
    return features


def anchor_operator(workload: Workload, kind: str) -> str | None:
    """The catalogue operator a model's fused operator anchors on: its workload's kind (``fused_depthwise_conv2d``:
    ``depthwise_conv2d``), else the kind its name reads (``kind``: ``softmax``, ``pool``); None where the catalogue
    has no such operator (a reshape)."""
    own = workload.kind.removeprefix("fused_")
    anchor = own if own != workload.kind and own in OPERATORS else ANCHOR_KINDS.get(kind, kind)
    return anchor if anchor in OPERATORS and anchor != "fused" else None


def source_balance(frame: pd.DataFrame) -> np.ndarray:
    """Row weights that make the models' operator rows (a ``source_model``) weigh as much in all as the catalogue's
    (the operators a model is built with are what is predicted; the catalogue's random configs are more rows)."""
    models = frame[MODEL_COLUMN] if MODEL_COLUMN in frame else pd.Series("", frame.index)
    from_models = models.fillna("").astype(str).ne("").to_numpy()
    if from_models.all() or not from_models.any():
        return np.ones(len(frame))
    return np.where(from_models, (~from_models).sum() / from_models.sum(), 1.0)


@dataclass(frozen=True)
class Composition:
    """measured ms ≈ ``scale`` x sum(calls x predicted ms) + ``per_call_ms`` x calls."""

    scale: float
    per_call_ms: float

    @staticmethod
    def terms(ops: pd.DataFrame, predicted_ms: np.ndarray) -> np.ndarray:
        """(sum over operators of calls x predicted ms, operator calls) of one model's operator rows."""
        calls = ops[CALLS_COLUMN].to_numpy(dtype="float64")
        return np.array([float(np.sum(calls * predicted_ms)), float(np.sum(calls))])

    @classmethod
    def fit(cls, terms: np.ndarray, measured_ms: np.ndarray, per_call_ms: float | None = None) -> Composition:
        """Non-negative least squares on models' (terms, measured ms), relative errors weighted alike (each row
        divided by its measured latency, so a 100 ms model does not outweigh a 1 ms one); the scale alone where the
        cost of a call is known (measured: :mod:`opbench.studies.models.call_cost`)."""
        from scipy.optimize import nnls

        terms, measured_ms = np.atleast_2d(np.asarray(terms, dtype="float64")), np.asarray(measured_ms, dtype="float64")
        if len(terms) < 1 or not np.all(measured_ms > 0):
            raise OpBenchError("the composition needs at least one model with a measured latency")
        relative = terms / measured_ms[:, None]
        if per_call_ms is None:
            (scale, per_call), _ = nnls(relative, np.ones(len(terms)))
            return cls(float(scale), float(per_call))
        (scale,), _ = nnls(relative[:, :1], 1 - per_call_ms * relative[:, 1])
        return cls(float(scale), per_call_ms)

    def predict(self, terms: np.ndarray) -> np.ndarray:
        return np.atleast_2d(terms) @ np.array([self.scale, self.per_call_ms])


def leave_one_model_out(catalogue: pd.DataFrame, ops: pd.DataFrame, measured_ms: dict[str, float],
                        train: TrainPredictor, per_call_ms: float | None = None) -> pd.DataFrame:
    """Each model's latency predicted with nothing of it seen: per model (a row), its measured ms, the sum of its
    operators measured alone (calls x ms) and predicted (by a predictor trained on the catalogue and the other models'
    operators), the composed prediction and its error (%). The composition is learned from the other models'
    operators as measured: how operators timed alone add up to a model is the runtime's, not the predictor's
    (``per_call_ms``: the cost of a call as measured, only the scale learned)."""
    models = sorted(measured_ms)
    if len(models) < 2:
        raise OpBenchError(f"leave-one-model-out needs at least 2 measured models, got {len(models)}")
    if missing := set(models) - set(ops[MODEL_COLUMN]):
        raise OpBenchError(f"no operator rows for {', '.join(sorted(missing))}")
    own = {m: ops[ops[MODEL_COLUMN] == m] for m in models}
    measured_terms = {m: Composition.terms(rows, rows["latency_ms"].to_numpy()) for m, rows in own.items()}
    results = []
    for model in models:
        others = [m for m in models if m != model]
        composition = Composition.fit(np.array([measured_terms[m] for m in others]),
                                      np.array([measured_ms[m] for m in others]), per_call_ms)
        predict = train(pd.concat([catalogue, ops[ops[MODEL_COLUMN] != model]], ignore_index=True))
        terms = Composition.terms(own[model], predict(own[model]))
        predicted = float(composition.predict(terms)[0])
        results.append({"model": model, "measured_ms": measured_ms[model], "ops_measured_ms": measured_terms[model][0],
                        "ops_predicted_ms": terms[0], "calls": int(terms[1]), "scale": composition.scale,
                        "per_call_us": composition.per_call_ms * 1e3, "predicted_ms": predicted,
                        "error_pct": 100 * (predicted / measured_ms[model] - 1)})
    return pd.DataFrame(results)
