"""Real ``nnictl`` experiments: every shipped one at once, their trials sharing one measurement service,
and that service killed in the middle of an experiment.

Each experiment runs in a private network namespace (``unshare -n``: NNI's manager binds every
interface) through ``tests/nni_session.py``, with the MLflow store and the service's folder private to
the test. For every trial NNI saw finish, NNI's export, MLflow and the JSON-lines log agree.
"""
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml

import mlflow
from opbench.tracking import read_jsonl, read_mlflow

from .conftest import ROOT, skip_unless_required

# full: nnictl, service, TVM. One xdist group, so one test at a time: NNI's manager fails an experiment whose tuner
# (dispatcher) has not connected within 10 s, hard-coded, and the two tests side by side start six dispatchers on two
# cores (a CI run failed both so; spread over both workers the suite was ~40 s shorter)
pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.xdist_group("nnictl")]

SHIPPED = sorted(p.name for p in (ROOT / "experiments").iterdir() if (p / "config.yml").exists())
HAS_REFERENCES = {"matmul-512-model"}  # the others run without them here: fewer seconds, same paths


def _unshare() -> list[str]:
    for cmd in (["unshare", "-n"], ["unshare", "-rn"]):
        if shutil.which("unshare") and subprocess.run(cmd + ["true"], capture_output=True).returncode == 0:
            return cmd
    skip_unless_required("NAMESPACES", "no private network namespace (unshare -n) for NNI's manager, which binds "
                                       "all interfaces")


class Experiment:
    """A shipped experiment, cut to ``trials``, logging to ``uri`` and ``log``, started with nnictl."""

    def __init__(self, name: str, folder: Path, uri: str, trials: int, concurrency: int = 1, references: bool = False,
                 idle_timeout_s: float = 10) -> None:
        self.name, self.folder, self.uri, self.log = name, folder, uri, folder / "trials.jsonl"
        folder.mkdir()
        config = yaml.safe_load((ROOT / "experiments" / name / "config.yml").read_text())
        config.update(maxTrialNumber=trials, trialConcurrency=concurrency, trialCodeDirectory=str(ROOT),
                      experimentWorkingDirectory=str(folder / "nni"),
                      searchSpaceFile=str(ROOT / "experiments" / name / "search_space.json"))
        if "codeDirectory" in config["tuner"]:
            config["tuner"]["codeDirectory"] = str(ROOT)
        config["trialCommand"] += (f" --tracking-uri {uri} --log {self.log} --repeat 2 --service-idle-timeout {idle_timeout_s}"
                                   + ("" if references else " --no-references"))
        self.study = config["trialCommand"].split("--study ")[1].split()[0]
        (folder / "config.yml").write_text(yaml.safe_dump(config))

    def start(self, port: int, env: dict[str, str], on: Callable[[list[str]], list[str]] | None = None) -> subprocess.Popen:
        """nnictl in a private network namespace: a fresh one (``unshare -n``), or a host's (``on``)."""
        session = [sys.executable, str(ROOT / "tests" / "nni_session.py"), str(self.folder / "config.yml"), str(port),
                   str(self.folder / "export.csv"), "480"]
        return subprocess.Popen(on(session) if on else _unshare() + session, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)

    def wait_for_tuner(self, session: subprocess.Popen, timeout_s: float = 120) -> None:
        """Until NNI's dispatcher (the tuner process) is up. NNI's manager gives it 10 s to connect, so
        experiments on a loaded 2-core host start one after another, not all at once."""
        deadline = time.time() + timeout_s
        while time.time() < deadline and session.poll() is None:
            logs = (self.folder / "nni").glob("*/log/dispatcher.log")  # one an attempt (tests/nni_session.py)
            if any("Dispatcher started" in log.read_text() for log in logs):
                return
            time.sleep(0.2)

    def finished_trials(self, service_dir: Path) -> pd.DataFrame:
        """NNI's export (the trials that reported a final result), checked against MLflow and the log once
        the measurement service in ``service_dir`` has written what it queued and exited."""
        _wait_for_exit(service_dir)
        exported = pd.read_csv(self.folder / "export.csv")
        stores = []
        for frame in (read_mlflow([self.study], self.uri), read_jsonl(self.log)):
            trials = frame[frame["reference"].isna()] if "reference" in frame else frame
            stores.append(trials.set_index("nni.trial_id").loc[exported["trialJobId"]])
        mlflow_rows, log_rows = stores
        assert mlflow_rows["trial_id"].tolist() == log_rows["trial_id"].tolist()
        assert (mlflow_rows["status"] == "ok").all() and mlflow_rows["nni.experiment_id"].nunique() == 1
        for _, row in exported.iterrows():
            for rows in stores:
                assert math.isclose(row["default"], rows.loc[row["trialJobId"], "latency_ms"], rel_tol=1e-9)
            knobs = [c for c in exported.columns if f"knob.{c}" in mlflow_rows.columns]
            assert knobs and all(row[k] == mlflow_rows.loc[row["trialJobId"], f"knob.{k}"] for k in knobs)
        self._check_best_so_far(mlflow_rows)
        return mlflow_rows

    def _check_best_so_far(self, trials: pd.DataFrame) -> None:
        """The experiment's parent run follows the best trial as the experiment goes (a chart in MLflow)."""
        client = mlflow.tracking.MlflowClient(self.uri)
        [parent] = client.search_runs([client.get_experiment_by_name(self.study).experiment_id],
                                      filter_string="tags.`opbench.kind` = 'study'")
        history = [m.value for m in sorted(client.get_metric_history(parent.info.run_id, "best_latency_ms"),
                                           key=lambda m: (m.timestamp, -m.value))]  # steps are trial numbers:
        # at concurrency 2 a later trial can finish first
        assert history == sorted(history, reverse=True) and history[-1] == trials["latency_ms"].min()
        assert parent.data.tags["best_trial_id"] == trials.loc[trials["latency_ms"].idxmin(), "trial_id"]


def _wait_for_exit(service_dir: Path, timeout_s: float = 120) -> None:
    """The service idles out and exits after writing what it queued (its .pid file goes with it): its
    writes can trail the trials NNI saw finish, by more while the tracking server is away."""
    deadline = time.time() + timeout_s
    while list(service_dir.glob("*.pid")) and time.time() < deadline:
        time.sleep(0.5)
    assert not list(service_dir.glob("*.pid")), "the measurement service did not exit after its idle timeout"


def _env(service_dir: Path) -> dict[str, str]:
    return {**os.environ, "OPBENCH_SERVICE_DIR": str(service_dir)}  # NNI passes its environment on to the trials


def test_every_shipped_experiment_runs_under_nnictl_at_once_on_one_service(tmp_path, empty_store):
    """All five shipped experiments side by side (matmul-512-tpe at concurrency 2): every trial NNI
    samples from the per-workload spaces is a valid schedule, and they share one warm service."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    uri, service_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "svc"
    experiments = [Experiment(name, tmp_path / name, uri, trials=2, concurrency=2 if name == "matmul-512-tpe" else 1,
                              references=name in HAS_REFERENCES) for name in SHIPPED]
    sessions = []
    for i, experiment in enumerate(experiments):
        sessions.append(experiment.start(18130 + i, _env(service_dir)))
        experiment.wait_for_tuner(sessions[-1])
    outputs = [s.communicate(timeout=600)[0] for s in sessions]
    assert all(s.returncode == 0 for s in sessions), "\n".join(o[-2000:] for o in outputs)
    for experiment in experiments:
        trials = experiment.finished_trials(service_dir)
        assert len(trials) == 2, experiment.name  # no trial lost to an invalid config or a crash
        refs = read_mlflow([experiment.study], uri).dropna(subset=["reference"]) \
            if experiment.name in HAS_REFERENCES else pd.DataFrame({"reference": []})
        assert set(refs["reference"]) == ({"te_default", "template_default", "torch", "numpy"}
                                          if experiment.name in HAS_REFERENCES else set())
    lines = [line for log in service_dir.glob("*.log") for line in log.read_text().splitlines()
             if "measurement service" in line]
    events = ["start" if "measurement service pid" in line else "exit" for line in lines if "pid" in line or "idle" in line]
    # 10 trials from five experiments share the warm service: a second one starts only after the first
    # idled out (10 s without a trial: experiments start one after another), never beside it
    assert events[0] == "start" and all(a != b for a, b in zip(events, events[1:])), lines


def test_the_service_killed_mid_trial_fails_that_trial_and_the_next_starts_a_fresh_one(tmp_path, empty_store):
    """Killed (the fault hook) after recording the first trial and before replying: NNI fails that trial,
    the next trials start a fresh service, and it replays the dead one's write-ahead log into MLflow."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    uri, service_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "svc"
    experiment = Experiment("matmul-512-tpe", tmp_path / "exp", uri, trials=3, references=True, idle_timeout_s=5)
    env = {**_env(service_dir), "OPBENCH_FAULT": "before-reply:SIGKILL:1", "OPBENCH_FAULT_ONCE": str(tmp_path / "fired")}
    session = experiment.start(18140, env)
    output = session.communicate(timeout=600)[0]
    assert session.returncode == 0, output[-3000:]

    trials = experiment.finished_trials(service_dir)
    assert len(trials) == 2  # the two after the kill, on a fresh service
    failed = {p.parent.name: p.read_text() for p in (experiment.folder / "nni").glob("*/environments/*/trials/*/trial.stderr")
              if "the measurement service (pid" in p.read_text()}
    assert len(failed) == 1 and "died during the trial" in next(iter(failed.values()))
    recorded = read_mlflow([experiment.study], uri)
    assert set(failed) <= set(recorded["nni.trial_id"])  # measured before the kill: kept
    assert not set(failed) & set(trials.index)
