"""Studies shared by hosts: PostgreSQL for Optuna, an MLflow server, `opbench worker` on other hosts
(network namespaces), one of them killed mid-trial, the MLflow server restarted; and the refusals
that keep a study sound."""
import contextlib
import json
import os
import signal
import subprocess
import time

import optuna
import pandas as pd
import pytest

from opbench.engines.optuna.storage import open_storage
from opbench.measure.rpc import request_session
from opbench.studies.shared import SPEC_ATTR, publish, register_host, study_hosts
from opbench.testing.farm import CLI, KEY, Farm
from opbench.testing.lan import Network, Postgres, Unavailable, free_port, lan
from opbench.tracking import read_jsonl, read_mlflow

from .cli import run_cli
from .conftest import skip_unless_required

SMALL = "matmul:m=64,n=64,k=64"
TRIALS = 8


_STARTED: list[subprocess.Popen] = []  # what a test on the hosts started: stopped when it ends, failed or not


@pytest.fixture(scope="module")
def _lan(tmp_path_factory):
    """Three worker hosts, a tracker's and two boards' on a private bridge; PostgreSQL and an MLflow
    server (its runs in PostgreSQL) on it."""
    try:
        with lan(["host-a", "host-b", "host-c", "tracker", "board-0", "board-1"], tmp_path_factory.mktemp("lan") / "artifacts") as parts:
            yield parts
    except Unavailable as exc:
        skip_unless_required("NAMESPACES", str(exc))


@pytest.fixture
def hosts(_lan):
    """The hosts, handed back as they were taken: a test that fails mid-outage leaves neither its
    processes running (they would hold the host's timing lock) nor its servers stopped."""
    yield _lan
    while _STARTED:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(_STARTED.pop().pid, signal.SIGKILL)
    _, cluster, server = _lan
    if not cluster.running:
        cluster.start()
    if not server.running:
        server.start()


def _wait(condition, what: str, timeout_s: float, *procs: subprocess.Popen):
    deadline = time.time() + timeout_s
    while not (found := condition()):
        for proc in procs:
            assert proc.poll() is None, f"{what}: {proc.args[-1]} exited ({proc.returncode}): {_tail(proc)}"
        assert time.time() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.3)
    return found


def _start(network: Network, host: str, argv: list[str], tmp_path, env: dict[str, str]) -> subprocess.Popen:
    """``opbench ARGV`` on ``host``, its records also in ``HOST.jsonl``, its output in a file (named last
    in ``args``, for messages)."""
    log = tmp_path / f"{host}.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(network.on(host, CLI + argv + ["--log", str(tmp_path / f"{host}.jsonl")]), env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.args = [*proc.args, str(log)]
    _STARTED.append(proc)
    return proc


def _connected(network: Network, host: str, address: str) -> bool:
    """Whether ``host`` has a connection open to ``address`` (HOST:PORT)."""
    out = subprocess.run(network.on(host, ["ss", "-Htn", "state", "established", "dst", address]),
                         capture_output=True, text=True, check=True)
    return bool(out.stdout.strip())


def _tail(proc: subprocess.Popen) -> str:
    return open(proc.args[-1]).read()[-3000:]


def _study(storage, name: str = "lan"):
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


@pytest.mark.xdist_group("lan")  # the tests on the hosts share them: one worker sets them up once
def test_three_hosts_share_a_study_and_lose_nothing_to_a_killed_host_or_a_restarted_server(hosts, tmp_path):
    """Beside the study, a shipped NNI experiment under a real nnictl on host-a (NNI's manager binds
    that host's addresses) logs its trials to the same server, through the same outages."""
    from .test_nnictl import Experiment

    network, cluster, server = hosts
    url = cluster.url("optuna")
    storage = open_storage(url)
    env = {**os.environ, "OPBENCH_STALE_AFTER_S": "4"}  # a silent host's trial is retried after 4 s, not 30
    experiment = Experiment("matmul-512-tpe", tmp_path / "nni", server.uri, trials=3)
    session = experiment.start(18150, {**env, "OPBENCH_SERVICE_DIR": str(tmp_path / "svc")},
                               on=lambda argv: network.on("host-a", argv))
    experiment.wait_for_tuner(session)

    def start(host: str, argv: list[str]) -> subprocess.Popen:
        return _start(network, host, argv, tmp_path, env)

    tune = start("host-a", ["tune", SMALL, "--study", "lan", "--storage", url, "--tracking-uri", server.uri,
                            "--trials", str(TRIALS), "--no-references", "--verify-rounds", "0", "--repeat", "2",
                            "--seed", "3"])
    _wait(lambda: (s := _study(storage)) is not None and SPEC_ATTR in s.user_attrs, "study published", 180, tune)
    workers = {host: start(host, ["worker", "--study", "lan", "--storage", url]) for host in ("host-b", "host-c")}
    running = optuna.trial.TrialState.RUNNING
    _wait(lambda: any(t.state == running and t.user_attrs.get("host") == "host-c" for t in _study(storage).trials),
          "a trial in flight on host-c", 180, tune, *workers.values())
    os.killpg(workers["host-c"].pid, signal.SIGKILL)  # the host, its kernel workers and all
    cluster.stop()  # PostgreSQL goes away mid-study until a host has met it: storage calls are retried until it is back
    _wait(lambda: any("unreachable" in open(proc.args[-1]).read() for proc in (tune, workers["host-b"])),
          "a host retrying its storage calls", 60, tune, workers["host-b"])
    cluster.start()
    server.stop()  # and the MLflow server: the hosts' writes wait for it (MLflow's client retries)
    time.sleep(1)
    server.start()
    for proc in (tune, workers["host-b"]):
        assert proc.wait(timeout=300) == 0, _tail(proc)
    output = session.communicate(timeout=300)[0]
    assert session.returncode == 0, output[-3000:]
    nni_trials = experiment.finished_trials(tmp_path / "svc")  # NNI's export, the server's runs and the log agree
    assert len(nni_trials) == 3 and set(nni_trials["host"]) == {"host-a"}

    study = _study(storage)
    measured = [t for t in study.trials if "status" in t.user_attrs]
    assert len(measured) == TRIALS and not [t for t in study.trials if t.state == running]
    stale = [t for t in study.trials if t.user_attrs.get("host") == "host-c" and "status" not in t.user_attrs
             and "rejected" not in t.user_attrs]
    assert stale and all(t.state == optuna.trial.TrialState.FAIL for t in stale)  # failed, and queued again:
    retried = [t for t in measured if t.system_attrs.get("failed_trial") in {s.number for s in stale}]
    assert retried and {t.user_attrs["host"] for t in retried} <= {"host-a", "host-b"}
    assert study_hosts(study.user_attrs) == ["host-a", "host-b", "host-c"]

    trials = read_mlflow(["lan"], server.uri)
    trials = trials[trials["engine_trial"].notna()]
    assert len(trials) == TRIALS and trials["engine_trial"].astype(str).is_unique  # no trial counted twice
    assert set(trials["trial_id"]) == {t.user_attrs["trial_id"] for t in measured}
    assert {"host-a", "host-b"} <= set(trials["host"]) <= {"host-a", "host-b", "host-c"}  # each host's facts
    logged = {r for host in ("host-a", "host-b", "host-c") if (tmp_path / f"{host}.jsonl").exists()
              for r in read_jsonl(tmp_path / f"{host}.jsonl")["trial_id"]}
    assert set(trials["trial_id"]) <= logged and len(logged - set(trials["trial_id"])) <= 1  # the killed trial's, at most
    exported = tmp_path / "host-b.csv"  # a dataset of one host's records, read back from the server
    out = run_cli("dataset", "export", "--experiment", "lan", "--tracking-uri", server.uri, "--host", "host-b",
                  "--status", "ok", "--out", str(exported))
    assert out.returncode == 0, out.stderr[-2000:]
    dataset = pd.read_csv(exported)
    assert len(dataset) == ((trials["host"] == "host-b") & (trials["status"] == "ok")).sum() > 0
    assert dataset["feat.ms000"].notna().all()  # the features, from each run's artifact on the server
    out = run_cli("report", "lan", "--tracking-uri", server.uri, "--out", str(tmp_path / "report"))  # from the server
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line[:1].isalpha()}
    assert rows["optuna-tpe"][1] == str(TRIALS) and (tmp_path / "report" / "curve_vs_trial.png").exists()
    # That timed runs never overlap is the lock's, tested where it is held (test_other_user, test_measure): wall-clock
    # stamps taken in three host processes after each run cannot show it on a loaded machine (a CI run failed so).


@pytest.mark.xdist_group("lan")
def test_worker_hosts_measure_on_boards_behind_a_tracker_on_hosts_of_their_own(hosts, tmp_path):
    """A study started on host-a on the farm's device, joined by host-b: both drive the boards. The test
    holds both boards until host-b waits for one at the tracker, so that each host gets one; while they
    are held, a measurement on host-c fails clearly."""
    network, cluster, server = hosts
    farm = Farm(tmp_path, servers=2, network=network)
    try:
        boards = set(farm.server_addresses())
        assert {b.split(":")[0] for b in boards} == {network.address("board-0"), network.address("board-1")}
        listed = subprocess.run(network.on("host-b", CLI + ["devices", "--tracker", farm.address]),
                                capture_output=True, text=True)
        assert listed.returncode == 0, listed.stderr[-2000:]
        row = next(line for line in listed.stdout.splitlines() if line.startswith(KEY))
        assert row.split()[1:4] == ["2", "2", "0"]  # devices, free, used
        held = [request_session(farm.remote)[0] for _ in boards]  # both boards busy from here
        busy = subprocess.Popen(network.on("host-c", CLI + ["measure", SMALL, "--device", farm.device, "--json",
                                                            "--connect-timeout", "3", "--tracking-uri", server.uri]),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = cluster.url("boards")
        storage = open_storage(url)
        tune = _start(network, "host-a", ["tune", SMALL, "--study", "boards", "--storage", url, "--device", farm.device,
                                          "--tracking-uri", server.uri, "--trials", "8", "--repeat", "2",
                                          "--seed", "5"], tmp_path, dict(os.environ))
        _wait(lambda: (s := _study(storage, "boards")) is not None and SPEC_ATTR in s.user_attrs,
              "study published", 180, tune)  # host-a now waits for a board for its first reference
        worker = _start(network, "host-b", ["worker", "--study", "boards", "--storage", url], tmp_path, dict(os.environ))
        out, err = busy.communicate(timeout=120)  # no free board within 3 s: an error, not a hang
        assert busy.returncode == 1 and json.loads(out)["status"] == "device_error", out[-2000:] + err[-2000:]
        assert f"no free '{KEY}' device at tracker {farm.address} within 3 s" in json.loads(out)["error"]
        _wait(lambda: _connected(network, "host-b", farm.address), "host-b waiting for a board", 180, tune, worker)
        del held  # the boards go free: each host takes one (it holds one at a time) and keeps it
        for proc in (tune, worker):
            assert proc.wait(timeout=300) == 0, _tail(proc)
    finally:
        farm.close()
    records = read_mlflow(["boards"], server.uri)
    trials = records[records["engine_trial"].notna()]
    assert len(trials) == 8 and set(trials["status"]) == {"ok"} and (trials["max_abs_err"] < 1e-3).all()
    assert set(records["reference"].dropna()) == {"te_default"}  # no torch/numpy remotely; the default is the first trial
    assert set(records["device"]) == {farm.device} and set(records["device_addr"]) == boards  # both boards
    board_of = {network.address(b): b for b in ("board-0", "board-1")}
    assert (records["host"] == records["device_addr"].str.split(":").str[0].map(board_of)).all()  # the boards' facts
    drivers = {t.user_attrs["host"] for t in _study(storage, "boards").trials if "status" in t.user_attrs}
    assert "host-b" in drivers and drivers <= {"host-a", "host-b"}


def test_a_database_away_longer_than_the_bound_stops_the_study_clearly_and_loses_nothing(tmp_path, tracking_uri):
    cluster = Postgres("127.0.0.1")
    try:
        url, log = cluster.url("optuna"), tmp_path / "trials.jsonl"
        argv = [*CLI, "tune", SMALL, "--trials", "500", "--storage", url, "--tracking-uri", tracking_uri, "--log", str(log),
                "--study", "away", "--no-references", "--verify-rounds", "0", "--repeat", "2"]
        with open(tmp_path / "out", "w") as out:
            proc = subprocess.Popen(argv, env={**os.environ, "OPBENCH_STORAGE_OUTAGE_S": "3"}, stdout=out,
                                    stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while not (log.exists() and log.read_text()):  # a trial measured
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "out").read_text()[-3000:]
            time.sleep(0.3)
        cluster.stop()
        assert proc.wait(timeout=120) == 1
    finally:
        cluster.close()
    output = (tmp_path / "out").read_text()
    assert f"Optuna storage {url} unreachable for 3 s" in output and "Traceback" not in output
    logged = read_jsonl(log)
    assert set(logged["trial_id"]) <= set(read_mlflow(["away"], tracking_uri)["trial_id"])  # every measured trial kept


@pytest.fixture(scope="module")
def local_database():
    cluster = Postgres("127.0.0.1")
    yield cluster.url("optuna")
    cluster.close()


TILES = {"tile": {"_type": "choice", "_value": [1, 2, 4, 8]}}


def test_a_trial_orphaned_before_its_first_heartbeat_is_failed_and_asked_again(local_database, monkeypatch):
    from opbench.engines.optuna import engine as optuna_engine

    monkeypatch.setenv("OPBENCH_STALE_AFTER_S", "0")  # orphaned as soon as it is seen
    engine = optuna_engine.OptunaEngine(TILES, 1, "orphans", local_database, "random", seed=0, budget=2)
    orphan = engine.study.ask(engine._distributions)  # asked by a process that died before anything else
    proposals = engine.ask(2)
    engine.close()
    settled = engine.study.trials[orphan.number]
    assert settled.state == optuna.trial.TrialState.FAIL and "orphaned" in settled.user_attrs["rejected"]
    assert len(proposals) == 2 and proposals[0].config == orphan.params  # its params, asked again


def _stopped_beating_an_hour_ago(study: optuna.Study, trial_id: int) -> None:
    """Backdate a trial's last heartbeat by an hour, as if its host died then: the fault placed, not waited for
    (live heartbeats stay well inside the grace period however busy the host)."""
    import sqlalchemy

    rdb = getattr(study._storage, "_backend", study._storage)
    with rdb.engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE trial_heartbeats SET heartbeat = heartbeat - interval '1 hour' "
                                           "WHERE trial_id = :trial"), {"trial": trial_id})


def test_a_resumed_study_settles_a_dead_processs_trial_and_leaves_a_live_hosts_to_it(local_database, monkeypatch):
    from opbench.engines.optuna import engine as optuna_engine
    from opbench.engines.optuna import storage as optuna_storage

    monkeypatch.setenv("OPBENCH_STALE_AFTER_S", "600")  # the grace period of the storages opened below
    monkeypatch.setattr(optuna_storage, "_last_recovery", -float("inf"))  # no outage seen by an earlier test

    def engine(resume: bool) -> optuna_engine.OptunaEngine:
        return optuna_engine.OptunaEngine(TILES, 1, "resumed", local_database, "random", seed=0, resume=resume, budget=4)

    dead = engine(resume=False)
    (killed,) = dead.ask(1)
    live = engine(resume=True)
    (measuring,) = live.ask(1)  # another host's trial, its heartbeats going on
    dead.close()  # its heartbeats stop, as when its process is killed
    _stopped_beating_an_hour_ago(live.study, killed.handle._trial_id)
    assert live.study._storage._get_stale_trial_ids(live.study._study_id) == [killed.handle._trial_id]
    resumed = engine(resume=True)
    assert resumed.recover({}) == []
    states = {t.number: t.state for t in resumed.study.trials}
    assert states[killed.handle.number] == optuna.trial.TrialState.FAIL
    assert states[measuring.handle.number] == optuna.trial.TrialState.RUNNING  # left to the host measuring it
    live.tell(measuring, {"status": "ok", "trial_id": "t-live", "latency_ms": 1.0, "threads": 1})
    live.close()
    assert resumed.study.trials[measuring.handle.number].state == optuna.trial.TrialState.COMPLETE
    (again,) = resumed.ask(1)
    resumed.close()
    assert again.config == killed.config  # the dead process's params, asked again


def test_a_two_worker_study_holds_its_budget_of_trials_the_default_first_each_linked_to_its_run(local_database,
                                                                                               tracking_uri,
                                                                                               monkeypatch):
    """With references (as users run it), 12 trials are 12 Optuna trials, each carrying its MLflow run's trial id:
    the template default is the first of them, not an extra trial learnt from its reference."""
    from opbench.space import get_template
    from opbench.workloads import parse_workload

    # no live worker's trial goes stale: on a busy host a heartbeat once missed the default 30 s, the other worker
    # failed that trial as stale and asked a 13th (staleness has tests of its own above)
    monkeypatch.setenv("OPBENCH_STALE_AFTER_S", "600")
    run_cli("tune", SMALL, "--workers", "2", "--trials", "12", "--storage", local_database, "--tracking-uri",
            tracking_uri, "--study", "pg2", "--seed", "4", "--repeat", "2", "--verify-rounds", "0", check=True)
    trials = _study(local_database, "pg2").trials
    assert len(trials) == 12 and {t.state.name for t in trials} <= {"COMPLETE", "FAIL"}
    runs = read_mlflow(["pg2"], tracking_uri)
    assert sorted(t.user_attrs["trial_id"] for t in trials) == sorted(runs[runs["reference"].isna()]["trial_id"])
    workload = parse_workload(SMALL)
    assert trials[0].params == {k: v for k, v in get_template(workload).default_config(workload).items()
                                if k in trials[0].params}
    assert set(runs["reference"].dropna()) == {"te_default", "torch", "numpy"}


def test_hosts_joining_a_study_at_once_are_all_recorded(local_database):
    """Each host writes its own key: hosts that read the list and wrote it back at the same time kept
    only the last writer (seen in CI: host-c missing after host-b and host-c joined together)."""
    from concurrent.futures import ThreadPoolExecutor

    study = optuna.create_study(study_name="joined-at-once", storage=open_storage(local_database))
    hosts = [f"host-{i}" for i in range(8)]
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(lambda host: register_host(optuna.load_study(study_name="joined-at-once",
                                                                   storage=open_storage(local_database)),
                                                  local_database, host), hosts))
    assert study_hosts(study.user_attrs) == hosts
    # a study published before: its shared list still counts
    assert study_hosts({"opbench.hosts": ["host-a"], "opbench.host:host-b": True, "opbench.spec": "{}"}) == \
        ["host-a", "host-b"]


@pytest.mark.parametrize("driver", ["postgresql", "postgresql+psycopg2", "postgresql+psycopg"])
def test_an_unreachable_database_is_named_with_its_password_masked_and_refused_with_exit_2(tracking_uri, driver):
    url = f"{driver}://opbench:s3cret-pw@127.0.0.1:{free_port()}/optuna"
    out = run_cli("tune", SMALL, "--trials", "1", "--storage", url, "--tracking-uri", tracking_uri)
    shown = url.replace("s3cret-pw", "***")
    assert out.returncode == 2 and f"Optuna storage {shown} cannot be reached" in out.stderr
    assert "s3cret-pw" not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_a_study_in_a_journal_file_is_refused_to_a_second_host(tmp_path):
    journal = str(tmp_path / "optuna-journal.log")
    study = optuna.create_study(study_name="lan", storage=open_storage(journal))
    publish(study, journal, json.dumps({"tracking_uri": None, "engine": {"seed": 0}}), "run0")
    register_host(study, journal, "another-host")
    out = run_cli("worker", "--study", "lan", "--storage", journal)
    assert out.returncode == 2 and "only one host's processes can share" in out.stderr and "PostgreSQL" in out.stderr
    missing = run_cli("worker", "--study", "nope", "--storage", journal)
    assert missing.returncode == 2 and "no study 'nope'" in missing.stderr
