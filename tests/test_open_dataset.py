"""The open dataset kept in the repository: collected on a host into its device's partition, a collection killed
mid-way resumed with nothing lost and nothing added twice, read in place, with nothing private in it."""
import json
import os
import platform
import subprocess
import sys

import pandas as pd
import pytest

from opbench.hardware.resources import host_facts
from opbench.paths import safe_name
from opbench.tracking.dataset import read_dataset
from tests.cli import run_cli

WORKLOADS = ["--workload", "matmul:m=16,n=16,k=8", "--workload", "softmax:m=4,n=32"]


def _collect(root, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "opbench.cli", "dataset", "collect", "--minutes", "10", "--trials", "3",
                           "--threads", "1", "--root", str(root), *WORKLOADS, *extra],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.mark.full
def test_a_collection_killed_midway_resumes_adding_nothing_twice_into_its_devices_partition(tmp_path):
    root = tmp_path / "records"
    killed = _collect(root, env={"OPBENCH_FAULT": "before-record:SIGKILL:3"})  # as the third trial is recorded
    assert killed.returncode == -9, killed.stderr[-2000:]
    partition = root / f"device={safe_name(host_facts().device_key)}"
    staged = (root / ".staging" / f"{safe_name(host_facts().device_key)}.jsonl").read_text().splitlines()
    assert len(staged) == 2 and not partition.exists()  # the two measured before the kill, kept as measured

    resumed = _collect(root)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "2 rows a stopped collection had measured, added" in resumed.stdout
    assert "4 trials run, 6 rows added" in resumed.stdout, resumed.stdout  # the first topped up by one, the second: 3
    again = _collect(root)
    assert "0 trials run, 0 rows added" in again.stdout

    frame = pd.read_parquet(root)  # pandas reads the partitions in place
    assert len(frame) == 6 and set(frame["device"]) == {safe_name(host_facts().device_key)}
    assert (frame.groupby("workload").size() == 3).all()
    assert not frame.duplicated(["task_key", "template", "threads", "config"]).any()
    assert {"latency_ms", "latency_lo_ms", "latency_hi_ms", "placements", "commit", "device_key"} <= set(frame.columns)
    assert any(c.startswith("feat.") for c in frame.columns)
    assert (frame["latency_lo_ms"] <= frame["latency_ms"]).all() and (frame["latency_ms"] <= frame["latency_hi_ms"]).all()
    assert all(json.loads(c) for c in frame["config"])  # each config a JSON object of knobs
    cells = {str(v) for column in frame.columns for v in frame[column].unique()}
    assert not {"host", "error", "study"} & set(frame.columns) and platform.node() not in cells  # no hostname
    assert not [c for c in cells if "/tmp" in c or str(tmp_path) in c]  # no path
    card = (root / "_CARD.md").read_text()
    assert f"| {host_facts().device_key} | 6 | 2 |" in card
    assert len(read_dataset(root)) == 6 and set(read_dataset(root)["status"]) == {"ok"}  # what the predictor reads
    one_device = run_cli("predictor", "study", "--data", str(root), "--hold-out", "device")
    assert one_device.returncode == 2 and "needs two groups or more; the dataset holds one" in one_device.stderr


def test_a_folder_without_partitions_is_no_dataset(tmp_path):
    out = run_cli("predictor", "study", "--data", str(tmp_path), "--hold-out", "device")
    assert out.returncode == 2 and "holds Parquet partitions (device=<key>/*.parquet)" in out.stderr


def test_a_bad_workload_exits_2_before_anything_is_measured(tmp_path):
    out = run_cli("dataset", "collect", "--workload", "matmul:m=4,n=4", "--root", str(tmp_path / "records"))
    assert out.returncode == 2 and "missing key(s) k" in out.stderr
    assert not (tmp_path / "records").exists()


def test_predict_for_another_device_of_the_dataset_from_its_recorded_host_facts(tmp_path, capsys):
    from opbench.cli import main
    from opbench.exceptions import OpBenchError
    from opbench.hardware.resources import HostFacts
    from opbench.predictor.model import LatencyModel, feature_columns
    from opbench.tracking.dataset.open_dataset import device_facts, read_open_dataset

    frame = read_open_dataset()  # the repository's: two devices or more
    devices = sorted(set(frame["device_key"]))
    assert len(devices) >= 2
    for key in devices:
        facts, rows = device_facts(key), frame[frame["device_key"] == key]
        for column, value in facts.features().items():
            assert (rows[column] == value).all(), column  # what its rows say of their host
    assert HostFacts.of_features(host_facts().features(), "here").features() == host_facts().features()
    with pytest.raises(OpBenchError, match=f"device 'nope' has no rows in .* \\(devices: {devices[0]}"):
        device_facts("nope")
    model = LatencyModel(feature_columns(frame, static_only=True), n_estimators=40).fit(frame)
    model.save(tmp_path / "static")
    predicted = {}
    for key in devices[:2]:
        assert main(["predict", "matmul-512", "--model", str(tmp_path / "static"), "--threads", "2", "--device", key]) == 0
        out = capsys.readouterr().out
        assert f"on {key}: predicted" in out
        predicted[key] = float(out.split("predicted ")[1].split(" ms")[0])
    assert len(set(predicted.values())) == 2  # the devices' own caches and ISA, not this host's
    LatencyModel(n_estimators=5).fit(frame).save(tmp_path / "built")  # the features of a build too
    assert main(["predict", "matmul-512", "--model", str(tmp_path / "built"), "--device", devices[0]]) == 2
    assert "predictor train --static-only" in capsys.readouterr().err
