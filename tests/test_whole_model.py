"""Whole-model prediction (issue 95): a model's latency composed from its operators' predicted latencies, learned on
other models and scored with nothing of the held-out model seen."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opbench.exceptions import OpBenchError
from opbench.measure.measurer import Measurer
from opbench.measure.protocol import RunResult
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.predictor.model import LatencyModel, feature_columns, trainable
from opbench.predictor.whole_model import CALLS_COLUMN, MODEL_COLUMN, Composition, leave_one_model_out, source_balance
from opbench.record import Status
from opbench.studies.models.call_cost import build_chains, per_call_ms
from opbench.studies.models.profile import checked_ms
from opbench.studies.models.tune import ModelSpec
from opbench.studies.models.with_defaults import build_with_defaults, time_interleaved
from opbench.tracking.dataset import read_dataset
from opbench.workloads.models.cache import extract

DATASET = Path(__file__).resolve().parent.parent / "datasets" / "records"
TINY_MODELS = ("small-cnn@tiny", "resnet-18@tiny", "squeezenet1.1@tiny")


def test_the_composition_recovers_a_scale_and_a_cost_per_call():
    terms = np.array([[10.0, 40], [2.0, 12], [50.0, 300], [0.5, 8]])
    measured = terms @ np.array([0.8, 0.004])
    fitted = Composition.fit(terms, measured)
    assert fitted.scale == pytest.approx(0.8) and fitted.per_call_ms == pytest.approx(0.004)
    assert fitted.predict(np.array([4.0, 100])) == pytest.approx([3.6])


def test_the_composition_weighs_each_model_by_its_relative_error_and_stays_non_negative():
    # a 1 ms model the scale 1 fits exactly and a 100 ms model that needs 0.5: relative weighting splits them
    # evenly where absolute errors would follow the large model
    fitted = Composition.fit(np.array([[1.0, 0], [200.0, 0]]), np.array([1.0, 100.0]))
    assert 0.5 < fitted.scale < 1.0 and fitted.scale == pytest.approx(0.6, abs=0.01)
    # least squares would charge the model of 100 calls -5 us a call
    no_negative_cost = Composition.fit(np.array([[1.0, 100], [1.0, 0]]), np.array([0.5, 1.0]))
    assert no_negative_cost.per_call_ms == 0.0 and no_negative_cost.scale == pytest.approx(0.6)


def test_with_the_cost_of_a_call_measured_the_scale_alone_is_fitted():
    terms = np.array([[10.0, 40], [2.0, 12], [50.0, 300], [0.5, 8]])
    measured = terms @ np.array([0.8, 0.004])
    fitted = Composition.fit(terms, measured, per_call_ms=0.004)
    assert fitted.scale == pytest.approx(0.8) and fitted.per_call_ms == 0.004
    # a model that would pull the fitted cost of a call up (as a held-out small model's absence let one) cannot
    slow = Composition.fit(np.array([[10.0, 40], [5.0, 200]]), np.array([8.0, 4.0 + 2.0]), per_call_ms=0.001)
    assert slow.per_call_ms == 0.001 and 0.8 < slow.scale < 1.2


def test_the_models_operators_weigh_as_much_in_all_as_the_catalogue():
    frame = pd.DataFrame({MODEL_COLUMN: [None, "", None, "", "resnet-18", "bert-base"]})
    assert list(source_balance(frame)) == [1, 1, 1, 1, 2, 2]
    assert list(source_balance(frame.head(4))) == [1, 1, 1, 1] and list(source_balance(frame.tail(2))) == [1, 1]

def test_the_composition_needs_a_measured_model():
    with pytest.raises(OpBenchError, match="at least one model"):
        Composition.fit(np.array([[1.0, 2]]), np.array([0.0]))


def test_a_built_models_run_gives_its_estimate_or_says_why_it_has_none():
    ok = RunResult(Status.OK, latencies_s=[0.002, 0.002, 0.004, 0.004, 0.002, 0.002], placement_sizes=[2, 2, 2])
    assert checked_ms(ok, "m", "the model", "its reference", agree=0.03) == pytest.approx(2.0)  # the fastest placement
    with pytest.raises(OpBenchError, match=r"m: the model's output differs from its reference \(max \|err\| 0.5\)"):
        checked_ms(RunResult(Status.WRONG_RESULT, max_abs_err=0.5), "m", "the model", "its reference", 0.03)
    with pytest.raises(OpBenchError, match="m: the model did not run: killed"):
        checked_ms(RunResult(Status.RUN_ERROR, "killed"), "m", "the model", "its reference", 0.03)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, dict[str, float], float]:
    """Three tiny models built with their template defaults: their operators measured, then the models timed
    together in new processes with the chains that time a call (its cost, ms, the third), as the benchmark does."""
    timing = TimingPolicy(placements=1, max_placements=1)
    with Measurer(MeasureOptions(timing)) as measurer:
        built = [build_with_defaults(ModelSpec(model, 1, 128, 1, timing), measurer,
                                     tmp_path_factory.mktemp(model.replace("@", "-"))) for model in TINY_MODELS]
        chains = build_chains(tmp_path_factory.mktemp("chains"), threads=1)
        latencies = time_interleaved(measurer, [b.run for b in built] + chains, placements=2)
    return pd.concat([b.ops for b in built], ignore_index=True), dict(zip(TINY_MODELS, latencies)), \
        per_call_ms(*latencies[-2:])


@pytest.mark.full
def test_each_operator_of_a_model_built_with_its_defaults_is_a_measured_row_flagged_as_its_anchor(tiny_models):
    ops, latencies, _ = tiny_models
    for model in TINY_MODELS:
        fused, _, _ = extract(model, 1, 128)
        rows = ops[ops[MODEL_COLUMN] == model]
        assert sorted(rows["workload"]) == sorted(f"model:{model}/{op.name}" for op in fused)
        assert rows[CALLS_COLUMN].sum() == sum(op.calls for op in fused)
        assert (trainable(rows)["latency_ms"] > 0).all() and len(trainable(rows)) == len(rows)
        assert set(rows["cache_state"]) == {"warm"}  # the measurer's, as the catalogue's records
        assert latencies[model] > 0
    convolutions = ops[ops["kind"] == "conv2d"]  # by their names: dense and depthwise (squeezenet, small-cnn)
    depthwise = convolutions["template"] == "fused_depthwise_conv2d_nchwc"
    assert depthwise.any() and set(convolutions["template"][~depthwise]) == {"fused_conv2d_nchwc"}
    assert (convolutions["feat.op_depthwise_conv2d"] == depthwise).all()
    assert (convolutions["feat.op_conv2d"] == ~depthwise).all() and (convolutions["feat.op_fused"] == 1).all()
    assert convolutions.filter(like="feat.cfg_").notna().any(axis=1).all()  # the template default's knobs
    reshapes = ops[ops["kind"] == "reshape"]  # no catalogue operator: flagged as what it is, fused
    assert len(reshapes) and (reshapes.filter(like="feat.op_").sum(axis=1) == 1).all()


@pytest.mark.full
def test_a_held_out_model_is_predicted_with_nothing_of_it_seen(tiny_models):
    ops, latencies, per_call = tiny_models
    assert math.isfinite(per_call)  # both chains ran and gave their expected output
    catalogue = trainable(read_dataset(DATASET)).head(300)
    trained_on: list[set[str]] = []

    def train(frame: pd.DataFrame) -> Callable[[pd.DataFrame], np.ndarray]:
        trained_on.append(set(frame[MODEL_COLUMN].dropna()))
        return LatencyModel(feature_columns(frame, static_only=True), n_estimators=30).fit(frame).predict

    scored = leave_one_model_out(catalogue, ops, latencies, train, per_call)
    assert list(scored["model"]) == sorted(TINY_MODELS)
    assert trained_on == [set(TINY_MODELS) - {model} for model in sorted(TINY_MODELS)]  # one predictor per model
    measured = {m: Composition.terms(rows, rows["latency_ms"].to_numpy()) for m, rows in ops.groupby(MODEL_COLUMN)}
    for row in scored.itertuples():
        others = [m for m in TINY_MODELS if m != row.model]  # the composition: fitted on them as measured
        composition = Composition.fit(np.array([measured[m] for m in others]), np.array([latencies[m] for m in others]),
                                      per_call)
        assert (row.scale, row.per_call_us) == pytest.approx((composition.scale, composition.per_call_ms * 1e3))
        assert row.ops_measured_ms == pytest.approx(measured[row.model][0])
        assert row.predicted_ms == pytest.approx(composition.predict(np.array([row.ops_predicted_ms, row.calls]))[0])
        assert row.predicted_ms > 0 and row.error_pct == pytest.approx(100 * (row.predicted_ms / row.measured_ms - 1))


def test_leave_one_model_out_refuses_one_model_or_models_without_operators():
    ops = pd.DataFrame({MODEL_COLUMN: ["a"], CALLS_COLUMN: [1], "latency_ms": [1.0]})
    with pytest.raises(OpBenchError, match="at least 2"):
        leave_one_model_out(ops, ops, {"a": 1.0}, lambda frame: lambda rows: np.ones(len(rows)))
    with pytest.raises(OpBenchError, match="no operator rows for b"):
        leave_one_model_out(ops, ops, {"a": 1.0, "b": 2.0}, lambda frame: lambda rows: np.ones(len(rows)))
