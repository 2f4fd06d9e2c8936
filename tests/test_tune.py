"""Tuning studies: Optuna on its journal file, killed and resumed; random and grid engines."""
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest

import mlflow
from opbench.engines.optuna.storage import JOURNAL_FILE, open_storage
from opbench.space import get_template
from opbench.tracking import read_mlflow
from opbench.workloads import parse_workload

from .cli import run_cli

CLI = [sys.executable, "-m", "opbench.cli"]
SMALL = "matmul:m=64,n=64,k=64"


def _tune(tmp_path, tracking_uri, *extra):
    return CLI + ["tune", SMALL, "--verify-rounds", "0", "--trials", "8", "--tracking-uri", tracking_uri, "--storage",
                  str(tmp_path / JOURNAL_FILE), "--study", "s", "--log", str(tmp_path / "log.jsonl"),
                  "--repeat", "2", "--seed", "1", "--no-references", *extra]


def test_random_engine_with_thread_search_and_references(tmp_path, tracking_uri):
    out = run_cli(*["tune", SMALL, "--verify-rounds", "0", "--engine", "random", "--trials", "4", "--search-threads", "1,2",
                                "--seed", "3", "--tracking-uri", tracking_uri, "--study", "r", "--repeat", "2"], check=True)
    assert "torch" in out.stdout and "te_default" in out.stdout and "best " in out.stdout
    assert "4/4 trials ok; 0 invalid configs rejected" in out.stdout  # the space holds only valid points
    client = mlflow.tracking.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("r")
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`opbench.kind` = 'study'")[0]
    plots = [a.path for a in client.list_artifacts(parent.info.run_id, "plots")]
    assert plots == ["plots/tuning_curve.png"]
    png = client.download_artifacts(parent.info.run_id, "plots/tuning_curve.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    frame = read_mlflow(["r"], tracking_uri)
    assert set(frame["reference"].dropna()) == {"te_default", "torch", "numpy"}
    tuned = frame[frame["reference"].isna()]
    assert len(tuned) == 4 and set(tuned["engine"]) == {"random"}
    assert set(tuned["threads"]) <= {1, 2}
    workload = parse_workload(SMALL)
    default = get_template(workload).default_config(workload)
    # the template default is measured once, as the budget's first trial, and is the study's reference of that name
    is_default = [all(row[f"knob.{k}"] == v for k, v in default.items()) for _, row in tuned.iterrows()]
    assert is_default[0] and sum(is_default) == 1 and "template_default" in out.stdout


def test_grid_engine_walks_the_space_in_order(tmp_path, tracking_uri):

    run_cli(*["tune", SMALL, "--verify-rounds", "0", "--engine", "grid", "--trials", "4", "--no-references",
                          "--tracking-uri", tracking_uri, "--study", "g", "--repeat", "2"], check=True)
    frame = read_mlflow(["g"], tracking_uri)  # in the order the trials started
    assert len(frame) == 4
    workload = parse_workload(SMALL)
    assert all(frame.loc[0, f"knob.{k}"] == v for k, v in get_template(workload).default_config(workload).items())
    assert list(frame["knob.unroll_explicit"])[1:] == [0, 1, 0]  # the default first, then the grid: the last knob fastest
    assert json.loads(frame.to_json())  # serialisable dataset


def test_built_in_spaces_never_reject_and_the_guard_still_catches_foreign_points(tmp_path):
    from opbench.engines.loop import template_check, valid_proposals
    from opbench.engines.optuna.engine import OptunaEngine
    from opbench.engines.simple import RandomEngine

    workload = parse_workload("conv2d:n=1,c=16,h=15,w=15,k=24,r=3,s=3,stride=2,pad=1")  # 8x8 out, odd extents
    template = get_template(workload, "conv2d")
    engine = RandomEngine(template.search_space(workload), 1, seed=0)
    assert len(valid_proposals(engine, template_check(workload, template), 200)) == 200 and engine.rejected == 0

    # a space not derived from the workload (a plugin's, an edited file): its foreign points are rejected
    foreign = {**template.search_space(workload), "x_split": {"_type": "choice", "_value": ["1x1x16", "2x1x4"]}}
    engine = RandomEngine(foreign, 1, seed=0)
    reasons = []
    engine.reject = lambda proposal, reason: reasons.append(reason)
    out = valid_proposals(engine, template_check(workload, template), 8)
    assert len(out) == 8 and all(p.config["x_split"] == "2x1x4" for p in out)
    assert reasons and engine.rejected == len(reasons) and "knob 'x_split'" in reasons[0]

    hopeless = RandomEngine({"x_split": {"_type": "choice", "_value": ["1x1x16"]}}, 1)
    out = valid_proposals(hopeless, template_check(workload, template), 1, max_rejects=3)
    assert len(out) == 1 and hopeless.rejected == 3  # then one passes, to be recorded as invalid_config

    study = OptunaEngine(foreign, 1, "rej", f"sqlite:///{tmp_path / 'o.db'}", seed=0)
    out = valid_proposals(study, template_check(workload, template), 4)
    rejected = [t for t in study.study.trials if "rejected" in t.user_attrs]
    assert len(out) == 4 and study.rejected == len(rejected) > 0
    assert study.done == 0  # rejected trials are not measured trials: a resumed study does not count them


def test_core_sets_searched_with_the_schedule(tracking_uri):
    run_cli(*["tune", SMALL, "--verify-rounds", "0", "--engine", "random", "--trials", "4", "--search-cores", "0;0,1", "--seed", "4",
                          "--tracking-uri", tracking_uri, "--study", "c", "--repeat", "2", "--no-references"],
                   check=True)
    frame = read_mlflow(["c"], tracking_uri)
    assert len(frame) == 4 and set(frame["cores"]) <= {"0", "0,1"} and "knob.cores" not in frame
    bad = run_cli(*["tune", SMALL, "--search-cores", "0;x", "--tracking-uri", tracking_uri])
    assert bad.returncode == 2 and "malformed core set 'x'" in bad.stderr


def test_a_new_study_starts_its_workers_before_setting_up_its_mlflow_store(tmp_path, tracking_uri, monkeypatch):
    """The warm-up (the worker processes' imports) begins before the Recorder opens MLflow's store, so the two
    overlap, and with it the zygotes of the libraries the study's references time."""
    from opbench.engines.registry import EngineSpec
    from opbench.measure.measurer import Measurer
    from opbench.studies import tune
    from opbench.studies.tune import TuneSpec, run_study

    began, warmed = threading.Event(), []
    warm_up, recorder = Measurer.warm_up, tune.Recorder

    def warm(self, resources, libraries=()):
        began.set()
        warm_up(self, resources, libraries)
        warmed.append(libraries)

    def recording(*args, **kwargs):
        assert began.wait(60), "the MLflow store was set up before the workers began to start"
        return recorder(*args, **kwargs)

    monkeypatch.setattr(Measurer, "warm_up", warm)
    monkeypatch.setattr(tune, "Recorder", recording)
    monkeypatch.setattr(tune, "measure_references", lambda *args, **kwargs: {})  # the libraries' zygotes suffice
    spec = TuneSpec(SMALL, trials=1, verify_rounds=0, tracking_uri=tracking_uri, study="w",
                    engine=EngineSpec(storage=str(tmp_path / JOURNAL_FILE)))
    result = run_study(spec)
    assert len(result.records) == 1 and warmed == [("torch", "numpy")]


def test_the_readme_python_api_script_runs_a_verified_study(tmp_path, tracking_uri):
    """The README's Python API example, as written (only its stores moved to this test's folder)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    script = readme.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(script.splitlines()) <= 16
    script = script.replace('seed=0)', f'seed=0, storage="{tmp_path / JOURNAL_FILE}")')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri})
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^best [0-9.]+ ms with \{'knob\.", out.stdout, re.M)
    assert re.search(r"^vs torch: ([0-9.]+x \([0-9.]+-[0-9.]+\)|not verified)$", out.stdout, re.M)
    assert out.stdout.count("\nok ") + out.stdout.startswith("ok ") >= 1  # on_record saw the trials


@pytest.mark.parametrize("nth", [1, 3])
def test_sigterm_before_a_queued_record_reaches_mlflow_loses_nothing(tmp_path, tracking_uri, nth):
    """SIGTERM lands while a record waits in the background writer's queue (the Nth write, through the
    fault hook): the command ends with 143 and MLflow holds every trial Optuna was told of."""
    argv = [a for a in _tune(tmp_path, tracking_uri) if a not in ("--log", str(tmp_path / "log.jsonl"))]
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "OPBENCH_FAULT": f"before-mlflow-write:SIGTERM:{nth}"})
    assert out.returncode == 143, out.stderr[-3000:]
    study = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / JOURNAL_FILE)))
    told = {t.user_attrs["trial_id"] for t in study.trials if "status" in t.user_attrs}
    assert len(told) >= nth - 1  # the fault fired at the Nth record's write
    frame = read_mlflow(["s"], tracking_uri)
    assert told <= set(frame["trial_id"])
