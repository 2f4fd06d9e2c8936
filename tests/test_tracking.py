"""Records survive both stores identically, and MLflow runs are plain MLflow."""
import json
import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

import mlflow
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.lifecycle import process_alive
from opbench.measure.types import TrialSpec
from opbench.record import TrialRecord
from opbench.testing.farm import CLI
from opbench.testing.lan import free_port
from opbench.tracking import Recorder, read_jsonl, read_mlflow
from opbench.tracking.mlflow_store import FEATURES_FILE, KIND_TAG
from opbench.tracking.writer import BackgroundWriter
from opbench.workloads import parse_workload


def test_jsonl_and_mlflow_round_trip_identically(measurer, tracking_uri, tmp_path):
    log = tmp_path / "trials.jsonl"
    w = parse_workload("matmul:m=32,n=32,k=32")
    specs = [TrialSpec(w, {}, Resources(1)), TrialSpec(w, {"j_split": "4x1x8", "order": "SSRSR:inner"}, Resources(2)),
             TrialSpec(w, {"i_split": "1x1x64"}, Resources(1))]
    with Recorder("roundtrip", tracking_uri, log, extra={"engine": "test"}) as recorder:
        measurer.measure_batch(specs, on_record=recorder)
    from_jsonl, from_mlflow = read_jsonl(log), read_mlflow(["roundtrip"], tracking_uri)
    pd.testing.assert_frame_equal(from_jsonl, from_mlflow)
    assert list(from_jsonl["status"]) == ["invalid_config", "ok", "ok"]
    tuned = from_jsonl[from_jsonl["knob.order"] == "SSRSR:inner"].iloc[0]  # records arrive as trials end
    assert tuned["knob.j_split"] == "4x1x8" and tuned["threads"] == 2
    assert isinstance(from_mlflow.loc[2, "latencies_ms"], list)
    assert {"op", "shape", "dtype", "template", "threads", "cores", "target", "host", "tvm_version",
            "source_model", "latency_ms", "latency_ms_mean", "latency_ms_std", "latency_cv", "gflops",
            "build_s", "run_s", "status", "error", "schema_version", "feat.flops", "feat.ms000"} <= set(from_jsonl)


def test_runs_are_nested_under_a_parent_and_readable_with_plain_mlflow(measurer, tracking_uri):
    w = parse_workload("add_relu:n=1,c=4,h=8,w=8")
    with Recorder("plain", tracking_uri) as recorder:
        measurer.measure_batch([TrialSpec(w, {}, Resources(1))] * 2, on_record=recorder)
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=["plain"])
    trials = runs[runs[f"tags.{KIND_TAG}"] == "trial"]
    parents = runs[runs[f"tags.{KIND_TAG}"] == "study"]
    assert len(trials) == 2 and len(parents) == 1
    assert set(trials["tags.mlflow.parentRunId"]) == set(parents["run_id"])
    assert (trials["params.op"] == "add_relu").all() and (trials["metrics.latency_ms"] > 0).all()
    metric_columns = [c for c in runs.columns if c.startswith("metrics.")]  # what the UI offers to compare
    assert "metrics.gflops" in metric_columns and len(metric_columns) < 30
    assert not any(c.startswith("metrics.feat.") for c in runs.columns)
    features = mlflow.artifacts.load_dict(f"runs:/{trials['run_id'].iloc[0]}/{FEATURES_FILE}")
    assert features["feat.flops"] > 0 and len(features) > 20
    assert read_mlflow(["plain"], tracking_uri)["feat.flops"].eq(features["feat.flops"]).all()


def test_torn_last_line_is_skipped(tmp_path):
    log = tmp_path / "t.jsonl"
    log.write_text('{"status": "ok", "latency_ms": 1.0}\n{"status": "o')
    frame = read_jsonl(log)
    assert len(frame) == 1 and frame.loc[0, "latency_ms"] == 1.0


def test_a_run_torn_by_a_killed_writer_is_not_read_back(tracking_uri):
    """A writer killed between creating a trial's run and terminating it leaves a RUNNING run with its
    tags but no metrics: readers skip it (a resumed study takes that record from its JSON-lines log)."""
    with Recorder("torn", tracking_uri) as recorder:
        recorder(TrialRecord(workload="w", latency_ms=1.0, trial_id="whole"))
        client = recorder.mlflow.client
        client.create_run(recorder.mlflow.experiment_id, tags={KIND_TAG: "trial", "status": "ok", "trial_id": "torn",
                                                               "mlflow.parentRunId": recorder.mlflow.parent_run_id})
    frame = read_mlflow(["torn"], tracking_uri)
    assert list(frame["trial_id"]) == ["whole"]


def test_the_background_writer_waits_for_timed_runs_and_survives_a_failing_store(tmp_path):
    lock, written = HostLock(tmp_path / "timing.lock"), []

    def write(record):
        if record["trial_id"] == "bad":
            raise ConnectionError("store down")
        written.append(record["trial_id"])

    writer = BackgroundWriter(write, lock)
    with lock.exclusive():  # a kernel being timed
        writer.put({"trial_id": "a"})
        time.sleep(0.3)
        assert written == []  # held back for the whole timed run
    writer.put({"trial_id": "bad"})
    writer.put({"trial_id": "b"})
    writer.flush()
    assert written == ["a", "b"]
    writer.close()


def test_a_write_to_a_store_that_is_away_does_not_hold_up_timed_runs(tmp_path):
    """MLflow's client retries a write to a server that is away for minutes; the writer lets go of the
    host lock after its hold bound, so a timed run on the host starts while that write still waits."""
    lock, writing, store_back, timed = HostLock(tmp_path / "timing.lock"), *(threading.Event() for _ in range(3))
    writer = BackgroundWriter(lambda record: (writing.set(), store_back.wait()), lock, hold_s=0.2)
    writer.put({"trial_id": "a"})
    assert writing.wait(60)  # the write holds the lock from here (a timed run asked first would not test it)

    def timed_run():
        with lock.exclusive():
            timed.set()

    threading.Thread(target=timed_run, daemon=True).start()
    assert timed.wait(60) and not store_back.is_set()  # the run took the lock while the write was still waiting
    store_back.set()
    writer.close()


def test_a_studys_ui_address_opens_its_runs_not_the_genai_overview(tracking_uri):
    from opbench.exceptions import OpBenchError
    from opbench.tracking import runs_url

    with Recorder("ui", tracking_uri) as recorder:
        recorder(TrialRecord(workload="w", latency_ms=1.0))
    experiment = mlflow.tracking.MlflowClient(tracking_uri).get_experiment_by_name("ui").experiment_id
    assert runs_url("ui", tracking_uri, 5001) == f"http://127.0.0.1:5001/#/experiments/{experiment}/runs"
    with pytest.raises(OpBenchError, match="no MLflow experiment named 'nope'"):
        runs_url("nope", tracking_uri)


def _process_tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [pid] + [p for child in (children.read_text().split() if children.exists() else []) for p in _process_tree(int(child))]


@pytest.mark.full  # starts MLflow's UI server
def test_opbench_ui_serves_the_store_it_is_given_without_its_url_in_any_command_line(tracking_uri):
    """The store's URL may hold a database password: it reaches MLflow's server through its environment, and
    the address printed opens the study's runs in that server."""
    with Recorder("ui", tracking_uri) as recorder:
        recorder(TrialRecord(workload="w", latency_ms=1.0))
    experiment = mlflow.tracking.MlflowClient(tracking_uri).get_experiment_by_name("ui").experiment_id
    port = free_port()
    ui = subprocess.Popen([*CLI, "ui", "ui", "--tracking-uri", tracking_uri, "--port", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # GenAI jobs: none here
    try:
        assert f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs" in ui.stderr.readline()
        query = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=ui"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(query, timeout=5) as reply:
                    assert json.load(reply)["experiment"]["experiment_id"] == experiment  # served from that store
                break
            except OSError:
                assert time.time() < deadline and ui.poll() is None, "the UI did not come up"
                time.sleep(0.5)
        store = tracking_uri.removeprefix("sqlite:///")
        server = _process_tree(ui.pid)[1:]  # the server and its workers (opbench ui itself was given the URL)
        for pid in server:
            assert store not in Path(f"/proc/{pid}/cmdline").read_text()
    finally:
        ui.terminate()
        ui.wait(60)
    deadline = time.time() + 30  # terminated, it stopped them all (SIGKILL lands within moments)
    while [pid for pid in server if process_alive(pid)] and time.time() < deadline:
        time.sleep(0.1)
    assert server and not [pid for pid in server if process_alive(pid)]


def _database_away() -> Exception:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    return MlflowException("connection refused to the server's database", error_code=TEMPORARILY_UNAVAILABLE)


def _server_gone_mid_request() -> Exception:
    """As MLflow's REST client raises it: a plain MlflowException, requests' ConnectionError only its context."""
    import requests
    from mlflow.exceptions import MlflowException

    try:
        raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('Remote end closed "
                                                  "connection without response'))")
    except requests.exceptions.ConnectionError as exc:
        try:
            raise MlflowException(f"API request to http://10.0.0.1:5000/api/2.0/mlflow/runs/create failed with exception {exc}")
        except MlflowException as wrapped:
            return wrapped


@pytest.mark.parametrize("away", [_database_away, _server_gone_mid_request], ids=["database", "server"])
def test_a_record_written_while_the_server_or_its_database_is_away_waits_for_it_and_lands_once(tracking_uri, monkeypatch,
                                                                                                away):
    """An MLflow server whose database restarts answers TEMPORARILY_UNAVAILABLE once MLflow's client has spent its
    retries, and one that restarts drops a request in flight, which MLflow's client does not retry (both seen in a
    three-host study: the study ended at the first, an NNI trial's record was missing from the server after the
    second): the writer's calls (a record's, a segment's) wait for the store, up to OPBENCH_STORAGE_OUTAGE_S, and the
    record lands as one run; any other error is raised at once."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    from opbench.tracking.mlflow_store import MlflowWriter

    record = TrialRecord(workload="matmul:m=32,n=64,k=64", task_key="matmul:m=32,n=64,k=64", op="matmul", threads=1,
                         latency_ms=1.0, latencies_ms=[1.0, 1.2], status="ok").to_row()
    writer = MlflowWriter("away", tracking_uri)
    create_run, refused = writer.client.wrapped.create_run, []

    def away_then_back(*args, **kwargs):
        if len(refused) < 2:
            refused.append(1)
            raise away()
        return create_run(*args, **kwargs)

    monkeypatch.setattr(writer.client.wrapped, "create_run", away_then_back)
    writer.write(record)
    runs = writer.client.search_runs([writer.experiment_id], f"tags.mlflow.parentRunId = '{writer.parent_run_id}'")
    assert len(refused) == 2 and [r.data.metrics["latency_ms"] for r in runs] == [1.0]

    def bad(*args, **kwargs):
        refused.append(1)
        raise MlflowException("a bad request", error_code=INVALID_PARAMETER_VALUE)

    monkeypatch.setattr(writer.client.wrapped, "create_run", bad)
    with pytest.raises(MlflowException, match="a bad request"):
        writer.write(record)
    assert len(refused) == 3  # asked once, not again
