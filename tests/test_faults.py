"""Faults at the worst moments, each killed at a chosen point through the fault hook (``OPBENCH_FAULT``),
never by sleeping: for every finished trial MLflow and Optuna agree, no trial is measured twice, and a
resumed study ends (it never waits on a dead process's trial)."""
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from opbench.engines.optuna.storage import JOURNAL_FILE, open_storage
from opbench.engines.registry import EngineSpec
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.studies.shared import publish
from opbench.studies.tune import TuneSpec
from opbench.testing.farm import CLI
from opbench.testing.lan import Postgres
from opbench.tracking import read_jsonl, read_mlflow
from opbench.tracking.dataset import export_mlflow
from opbench.tracking.dataset.formats import read_rows
from opbench.tracking.mlflow_store import MlflowWriter, _client

SMALL = "matmul:m=64,n=64,k=64"
TRIALS = 6
HANG_GUARD_S = 600  # a resume that has not ended by then hangs (the study itself takes well under a minute)

pytestmark = pytest.mark.slow


def _tune(storage: str, tracking_uri: str, *extra: str, trials: int = TRIALS) -> list[str]:
    return [*CLI, "tune", SMALL, "--trials", str(trials), "--storage", storage, "--tracking-uri", tracking_uri,
            "--study", "s", "--repeat", "2", "--seed", "1", "--no-references", "--verify-rounds", "0", *extra]


def _killed(argv: list[str], fault: str, tmp_path) -> int:
    """Run ``argv`` in a session of its own with the fault hook armed; its exit status (killed: negative).
    A ``:group`` fault kills the whole session (tune and its worker processes) at once."""
    with open(tmp_path / "killed.out", "w") as out:
        proc = subprocess.run(argv, env={**os.environ, "OPBENCH_FAULT": fault}, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True, timeout=HANG_GUARD_S)
    return proc.returncode


def _killed_in_turn(argv: list[str], faults: list[tuple[str, int]], tmp_path, done: Callable[[], int] | None = None) -> None:
    """Kill a study at each of ``faults`` (point, expected exit status) in turn: its first run at the first, each
    resume at the next. With ``done``, each run must say it found ``done()`` trials already done."""
    for n, (fault, code) in enumerate(faults):
        before = done() if done and n else 0
        assert _killed(argv + ["--resume"] * bool(n), fault, tmp_path) == code, (tmp_path / "killed.out").read_text()[-3000:]
        if done:
            assert f"({before} already done)" in (tmp_path / "killed.out").read_text()


def _resumed(argv: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _assert_nothing_lost(storage: str, tracking_uri: str, parent_run_id: str | None = None, expected: int = TRIALS) -> None:
    """Optuna counts ``expected`` measured trials, each once; MLflow holds exactly those, with the latency Optuna was told."""
    study = optuna.load_study(study_name="s", storage=open_storage(storage))
    measured = [t for t in study.trials if "status" in t.user_attrs]
    assert len(measured) == expected and not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    frame = read_mlflow(["s"], tracking_uri, parent_run_id or _latest_parent(tracking_uri))
    trials = frame[frame["engine_trial"].notna()]
    assert trials["trial_id"].is_unique and trials["engine_trial"].astype(str).is_unique
    assert set(trials["trial_id"]) == {t.user_attrs["trial_id"] for t in measured}
    told = {t.user_attrs["trial_id"]: t.values[0] for t in measured if t.state == optuna.trial.TrialState.COMPLETE}
    for _, row in trials[trials["trial_id"].isin(told)].iterrows():
        assert row["latency_ms"] == pytest.approx(told[row["trial_id"]])
    _assert_exports_completely(tracking_uri)


def _assert_exports_completely(tracking_uri: str) -> None:
    """The resumed study's dataset holds every record MLflow's runs hold, each once, all from segments."""
    with tempfile.TemporaryDirectory() as scratch:
        done = export_mlflow(Path(scratch) / "s.parquet", ["s"], tracking_uri)
        exported = read_rows(Path(scratch) / "s.parquet", None)
    assert done.read_run_by_run == 0  # every writer, the killed one too, sealed what it wrote
    ids = [r["trial_id"] for r in exported]
    assert len(ids) == len(set(ids)) and set(ids) == set(read_mlflow(["s"], tracking_uri)["trial_id"])


def _parents(tracking_uri: str) -> list[str]:
    """The study's parent runs (its invocations), oldest first."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name("s")
    runs = client.search_runs([exp.experiment_id], "tags.`opbench.kind` = 'study'", order_by=["attributes.start_time ASC"])
    return [r.info.run_id for r in runs]


def _latest_parent(tracking_uri: str) -> str:
    return _parents(tracking_uri)[-1]


# Each point, and the time it is reached in that process when the process is killed there: the study is killed
# at the first, each resume at the next, and a last resume finishes it (a resume killed in turn is a killed study too).
SINGLE_HOST_FAULTS = [
    ("before-record:SIGKILL:3", -signal.SIGKILL),  # measured, in no log yet: asked again on resume
    ("before-mlflow-write:SIGKILL:1", -signal.SIGKILL),  # in the write-ahead log only
    ("before-tell:SIGKILL:1", -signal.SIGKILL),  # in the log and queued for MLflow, Optuna not told
    ("before-tell:SIGTERM:1", 143),
    ("before-segment-upload:SIGKILL:1", -signal.SIGKILL),  # every trial measured and told, none sealed
]


def test_tune_killed_at_each_worst_moment_in_turn_resumes_with_nothing_lost(tmp_path, tracking_uri):
    storage, log = str(tmp_path / JOURNAL_FILE), tmp_path / "log.jsonl"
    argv = _tune(storage, tracking_uri, "--log", str(log))
    logged = lambda: len(_engine_rows(read_jsonl(log)))  # every trial its --log holds counts as done
    _killed_in_turn(argv, SINGLE_HOST_FAULTS, tmp_path, logged)
    logged_before = logged()
    out = _resumed(argv)
    assert f"({logged_before} already done)" in out.stderr
    assert len(_parents(tracking_uri)) == 1  # every resume continued the killed invocation's parent run
    _assert_nothing_lost(storage, tracking_uri)
    logged = _engine_rows(read_jsonl(log))  # the user's --log holds each trial once, as MLflow does
    assert len(logged) == TRIALS and set(logged["trial_id"]) == set(_engine_rows(read_mlflow(["s"], tracking_uri))["trial_id"])


def _engine_rows(frame):
    return frame[frame["engine_trial"].notna()]


def test_a_second_invocation_killed_and_resumed_keeps_to_its_own_run(tmp_path, tracking_uri):
    """The same study name run twice: the second run's resume and `verify` see its own trials only."""
    storage = str(tmp_path / JOURNAL_FILE)
    argv = _tune(storage, tracking_uri)
    subprocess.run(argv, check=True, capture_output=True, timeout=HANG_GUARD_S)
    first = _latest_parent(tracking_uri)
    assert _killed(argv, "before-tell:SIGKILL:4", tmp_path) == -signal.SIGKILL
    _resumed(argv)
    runs = _parents(tracking_uri)
    assert len(runs) == 2 and runs[0] == first
    _assert_nothing_lost(storage, tracking_uri, runs[1])
    assert len(read_mlflow(["s"], tracking_uri, first)) == TRIALS  # the first invocation's run is untouched
    verify = subprocess.run([*CLI, "verify", "s", "--tracking-uri", tracking_uri, "--rounds", "1", "--repeat", "2"],
                            capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert verify.returncode == 0 and f"run {runs[1]}" in verify.stderr, verify.stderr[-3000:]


@pytest.fixture(scope="module")
def database():
    cluster = Postgres("127.0.0.1")
    yield cluster
    cluster.close()


# tune's parent is the test: the parent fault goes first, before any resume has tune replay a dead worker's log
# (a record tune writes itself, where the fault would fire in tune and kill the test).
SHARED_FAULTS = [
    ("before-mlflow-write:SIGKILL:2:parent", -signal.SIGKILL),  # tune alone: its workers end with it
    ("before-tell:SIGKILL:2:group", -signal.SIGKILL),  # tune and its workers at once, a worker between record and tell
    ("before-tell:SIGTERM:2", 1),  # each worker terminated: tune says so and fails
]


def test_a_shared_study_killed_and_resumed_at_once_ends_with_nothing_lost(database, tmp_path, tracking_uri):
    """On PostgreSQL with two worker processes, killed at each fault in turn (each resume at the next);
    resumed inside the stale timeout (the dead workers' trials still look fresh by their heartbeats), no
    resume may wait on them."""
    trials = 2 * TRIALS  # each resume measures a few before its fault: the last one's must come before the budget's end
    storage = database.url("shared")
    argv = _tune(storage, tracking_uri, "--workers", "2", trials=trials)
    _killed_in_turn(argv, SHARED_FAULTS, tmp_path)
    _resumed(argv)
    _assert_nothing_lost(storage, tracking_uri, expected=trials)


def test_a_killed_worker_host_replays_its_log_on_rejoining(database, tmp_path, tracking_uri):
    """`opbench worker` killed between its MLflow write and telling Optuna (SIGKILL, then on rejoining SIGTERM):
    each time it rejoins, it tells Optuna that record rather than measure the trial again."""
    storage = database.url("rejoin")
    spec = TuneSpec(SMALL, TRIALS, EngineSpec("optuna", seed=1), study="s", references=False, verify_rounds=0,
                    measure=MeasureOptions(TimingPolicy(repeat=2)), tracking_uri=tracking_uri)
    parent = MlflowWriter("s", tracking_uri)  # a study published by `tune` on another host, measuring nothing here
    publish(optuna.create_study(study_name="s", storage=open_storage(storage)), storage, spec.to_json(),
            parent.parent_run_id)
    worker = [*CLI, "worker", "--study", "s", "--storage", storage]
    for fault, code in [("before-tell:SIGKILL:2", -signal.SIGKILL), ("before-tell:SIGTERM:2", 143)]:
        assert _killed(worker, fault, tmp_path) == code, (tmp_path / "killed.out").read_text()[-3000:]
    out = subprocess.run(worker, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_nothing_lost(storage, tracking_uri, parent.parent_run_id)


def test_a_killed_processs_build_folder_is_removed_by_the_next_measurer_and_a_live_ones_kept():
    from opbench.paths import build_dir

    mine = build_dir()
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now
    left = mine.parent / f"{dead.pid}-killed"
    left.mkdir()
    (left / "kernel.so").write_bytes(b"built before the kill")
    fresh = build_dir()
    assert not left.exists() and mine.is_dir() and fresh.parent == mine.parent and fresh != mine
    assert oct(mine.parent.stat().st_mode & 0o777) == "0o700"  # this user's only (paths.private_dir)
