"""Tuning logs as data: export round trips, MetaSchedule import, the predictor, the model engine."""
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

import mlflow
from opbench.exceptions import OpBenchError
from opbench.predictor.model import MAX_LABEL_CV, LatencyModel, evaluate, split, top_k_score, trainable, work_scale
from opbench.tracking import read_mlflow
from opbench.tracking.dataset import card, load_records, read_dataset, write_dataset

from .cli import run_cli

pytestmark = pytest.mark.xdist_group("data")  # one worker sets up the module's expensive fixture once


def _run(*args):
    return run_cli(*args, check=True)


@pytest.fixture(scope="session")  # not module: set up once even when xdist interleaves other files' tests
def logged(tmp_path_factory, empty_store):
    """Two small studies (two ops, 1 and 2 threads) in a private MLflow store and a JSON-lines log."""
    tmp = tmp_path_factory.mktemp("data")
    shutil.copyfile(empty_store, tmp / "mlflow.db")
    uri, log = f"sqlite:///{tmp / 'mlflow.db'}", tmp / "log.jsonl"
    for study, workload in (("a", "matmul:m=64,n=64,k=64"), ("b", "dense:m=32,n=64,k=64")):
        _run("tune", workload, "--verify-rounds", "0", "--engine", "random", "--trials", "10", "--search-threads", "1,2", "--seed", "1",
             "--tracking-uri", uri, "--study", study, "--repeat", "2", "--log", str(log), "--no-references")
    return uri, log, tmp


def test_export_round_trips_through_parquet_csv_and_jsonl(logged, tmp_path):
    uri, log, _ = logged
    frame = load_records("mlflow", ["a", "b"], tracking_uri=uri)
    assert len(frame) == 20 and set(frame["op"]) == {"matmul", "dense"}
    for suffix in ("parquet", "jsonl", "csv"):
        back = read_dataset(write_dataset(frame, tmp_path / f"d.{suffix}"))
        assert list(back.columns) == list(frame.columns)
        assert np.allclose(back["latency_ms"].fillna(-1), frame["latency_ms"].fillna(-1))
    from_log = load_records("jsonl", logs=[log])
    assert sorted(from_log["trial_id"]) == sorted(frame["trial_id"])
    ok = load_records("mlflow", ["a", "b"], tracking_uri=uri, status=["ok"], ops=["dense"])
    assert set(ok["status"]) == {"ok"} and set(ok["op"]) == {"dense"} and 0 < len(ok) <= 10
    text = card(frame)
    assert "rows: 20" in text and "matmul 10" in text and "dense 10" in text


def test_export_command_and_its_errors(logged, tmp_path):
    uri, _, _ = logged
    out = _run("dataset", "export", "--experiment", "a", "--tracking-uri", uri, "--out", str(tmp_path / "a.parquet"))
    assert "rows: 10" in out.stdout and len(pd.read_parquet(tmp_path / "a.parquet")) == 10
    bad = run_cli(*["dataset", "export", "--experiment", "nope", "--tracking-uri", uri, "--out",
                                str(tmp_path / "x.csv")])
    assert bad.returncode == 2 and "no MLflow experiment named 'nope'" in bad.stderr
    with pytest.raises(OpBenchError, match="dataset files are .parquet, .jsonl, .csv"):
        write_dataset(pd.DataFrame({"a": [1]}), tmp_path / "x.txt")


def _synthetic(n=400, seed=0):
    """Latency that depends on the features in a known way, for three 'ops' and two thread counts."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.uniform(0, 4, n), rng.integers(1, 3, n)
    op = rng.choice(["matmul", "dense", "conv2d"], n)
    latency = np.exp(0.8 * x1) / x2 * np.where(op == "conv2d", 1.5, 1.0)
    return pd.DataFrame({"feat.x1": x1, "feat.threads": x2.astype(float), "feat.op_conv2d": (op == "conv2d") * 1.0,
                         "threads": x2, "op": op, "workload": [f"{o}-{i % 4}" for i, o in enumerate(op)],
                         "source_model": "", "status": "ok", "latency_ms": latency})


def test_predictor_learns_a_known_latency_law_and_reports_metrics(tmp_path):
    train, test = split(_synthetic(), "random", seed=0)
    model = LatencyModel(seed=0).fit(train)
    metrics = evaluate(model, test)
    assert metrics["r2_log"] > 0.95 and metrics["spearman"] > 0.95 and metrics["mape"] < 0.15
    assert metrics["top1"] > 0.8 and metrics["top5"] >= metrics["top1"]
    model.save(tmp_path / "m")
    assert np.allclose(LatencyModel.load(tmp_path / "m").predict(test), model.predict(test))


def test_the_predictor_scales_by_the_work_flops_or_bytes_moved_and_takes_row_weights():
    frame = pd.DataFrame({"feat.flops": [1e6, 0.0, 1290.0], "feat.bytes": [1e4, 512.0, 2896.0]})
    assert list(work_scale(frame)) == [1e6, 512.0, 2896.0]  # a copy moves bytes; a tiny matmul reads more than it computes
    assert list(work_scale(pd.DataFrame({"feat.flops": [np.nan]}))) == [1.0]
    # the same features measured at 1 ms and at 2 ms: the rows weighing 9x pull the prediction to theirs
    same = pd.DataFrame({"feat.x1": [1.0] * 20, "workload": "w", "status": "ok", "latency_ms": [1.0] * 10 + [2.0] * 10})
    light, heavy = LatencyModel(seed=0), LatencyModel(seed=0)
    light.fit(same, np.r_[np.full(10, 9.0), np.ones(10)])
    heavy.fit(same, np.r_[np.ones(10), np.full(10, 9.0)])
    assert light.predict(same.head(1))[0] < 1.3 and heavy.predict(same.head(1))[0] > 1.6
    with pytest.raises(OpBenchError, match="3 weights for 20 measured rows"):
        LatencyModel().fit(same, np.ones(3))

def test_group_splits_hold_out_whole_groups():
    frame = _synthetic()
    for how, column in (("by-op", "op"), ("by-threads", "threads")):
        train, test = split(frame, how, seed=1)
        assert not set(train[column]) & set(test[column]) and len(test)
    with pytest.raises(OpBenchError, match="split by-model needs at least 2 distinct 'source_model'"):
        split(frame, "by-model")
    with pytest.raises(OpBenchError, match="unknown split 'sideways'"):
        split(frame, "sideways")


def test_labels_their_own_record_calls_noisy_are_not_trained_on():
    frame = pd.DataFrame({"status": ["ok", "ok", "ok", "ok", "run_error"], "latency_ms": [1.0, 2.0, 3.0, 0.0, 1.0],
                          "latency_cv": [0.01, MAX_LABEL_CV, 2 * MAX_LABEL_CV, 0.01, 0.01]})
    assert list(trainable(frame)["latency_ms"]) == [1.0, 2.0]  # a busy host's label, a zero and a failure left out
    unknown = frame.assign(latency_cv=np.nan)  # records that kept no spread (imported logs) are all labels
    assert list(trainable(unknown)["latency_ms"]) == [1.0, 2.0, 3.0]
    assert list(trainable(frame.drop(columns="latency_cv"))["latency_ms"]) == [1.0, 2.0, 3.0]


def test_top_k_score_is_the_share_of_the_best_latency_found():
    frame = pd.DataFrame({"workload": ["w"] * 3, "latency_ms": [1.0, 2.0, 4.0]})
    assert top_k_score(frame, np.array([3.0, 1.0, 2.0]), 1) == 0.5  # picks the 2 ms one
    assert top_k_score(frame, np.array([3.0, 1.0, 2.0]), 3) == 1.0


def test_predictor_commands_log_the_model_to_mlflow(logged, tmp_path):
    uri, _, _ = logged
    _run("dataset", "export", "--tracking-uri", uri, "--experiment", "a", "--experiment", "b",
         "--out", str(tmp_path / "d.parquet"))
    # the labels' own spread is not what this tests: on a busy host one op's 64x64 kernels may all read noisy
    pd.read_parquet(tmp_path / "d.parquet").drop(columns="latency_cv").to_parquet(tmp_path / "d.parquet")
    out = _run("predictor", "train", "--data", str(tmp_path / "d.parquet"), "--split", "by-op", "--out",
               str(tmp_path / "p"), "--tracking-uri", uri)
    assert "held out" in out.stdout and "top1" in out.stdout
    metrics = json.loads((tmp_path / "p" / "metrics.json").read_text())
    assert set(metrics) == {"n", "mape", "r2_log", "spearman", "within_10pct", "top1", "top5"}
    client = mlflow.tracking.MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("predictor").experiment_id])[0]
    assert math.isclose(run.data.metrics["mape"], metrics["mape"])
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {"plots/predicted_vs_measured.png"}
    mlflow.set_tracking_uri(uri)
    assert mlflow.xgboost.load_model(f"runs:/{run.info.run_id}/model").predict is not None
    pred = _run("predict", "matmul:m=64,n=64,k=64", "--model", str(tmp_path / "p"), "--threads", "2")
    assert "predicted" in pred.stdout and "ms" in pred.stdout


def test_model_engine_warm_started_from_other_workloads_logs(logged, tmp_path):
    uri, _, _ = logged
    _run("dataset", "export", "--tracking-uri", uri, "--experiment", "b", "--out", str(tmp_path / "b.parquet"))
    out = _run("tune", "matmul:m=64,n=64,k=64", "--verify-rounds", "0", "--engine", "model", "--warm-start", str(tmp_path / "b.parquet"),
               "--trials", "6", "--configs-per-step", "3", "--seed", "0", "--tracking-uri", uri, "--study", "m",
               "--repeat", "2", "--no-references")
    assert "\nbest " in out.stdout  # the summary table's row of the best config
    frame = read_mlflow(["m"], uri)
    assert len(frame) == 6 and set(frame["engine"]) == {"model"}
    assert (frame["status"] != "invalid_config").all()  # candidates are validated before measuring
    knobs = frame[[c for c in frame.columns if c.startswith("knob.")] + ["threads"]].astype(str)
    assert not knobs.duplicated().any()


def test_model_engine_runs_as_a_custom_nni_tuner(logged, measurer, tmp_path):
    """What NNI's dispatcher does with `tuner: {codeDirectory, className, classArgs}`, driven by hand."""
    from nni.tools.package_utils.tuner_factory import create_customized_class_instance

    from opbench.engines._base import split_threads
    from opbench.hardware.resources import Resources
    from opbench.integration.nni.experiment import ExperimentSpec, write_experiment
    from opbench.measure.types import TrialSpec
    from opbench.workloads import parse_workload

    uri, _, _ = logged
    _run("dataset", "export", "--tracking-uri", uri, "--experiment", "b", "--out", str(tmp_path / "b.parquet"))
    # the warm start is under test here, not the label filter: a busy CI host must not leave it under 4 labels
    write_dataset(read_dataset(tmp_path / "b.parquet").assign(latency_cv=0.0), tmp_path / "b.parquet")
    small = "matmul:m=64,n=64,k=64"
    config = write_experiment(ExperimentSpec(small, "Model", 6, search_threads=[1, 2],
                                             warm_start=str(tmp_path / "b.parquet")), tmp_path / "exp")
    section = yaml.safe_load(config.read_text())["tuner"]
    section["codeDirectory"] = str((config.parent / section["codeDirectory"]).resolve())
    tuner = create_customized_class_instance(section)
    tuner.update_search_space(json.loads((config.parent / "search_space.json").read_text()))
    warm = len(trainable(read_dataset(tmp_path / "b.parquet")))
    points = []
    for parameter_id in range(6):
        params = tuner.generate_parameters(parameter_id)
        if parameter_id == 0:  # the warm-start logs rank the very first batch
            assert tuner.engine.trained_on == warm > 0
        knobs, threads = split_threads(params, 1)
        record = measurer.measure(TrialSpec(parse_workload(small), knobs, Resources(threads)))
        assert record["status"] == "ok", record.get("error")
        tuner.receive_trial_result(parameter_id, params, {"default": record["latency_ms"]})
        tuner.trial_end(parameter_id, True)
        points.append(json.dumps(params, sort_keys=True))
    assert len(set(points)) == 6 and all("threads" in json.loads(p) for p in points)
    for parameter_id in (6, 7):  # the rest of the first ranked batch (8); these trials fail: nothing learnt
        tuner.generate_parameters(parameter_id)
        tuner.trial_end(parameter_id, False)
    assert tuner.engine.trained_on == warm
    tuner.generate_parameters(8)  # the next batch is ranked by a model retrained on the 6 measured trials
    assert tuner.engine.trained_on == warm + 6
