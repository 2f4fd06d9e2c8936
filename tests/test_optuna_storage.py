"""Optuna's storage: the journal file shared by processes, a killed writer, the dashboard, sqlite, bad URLs."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from opbench.engines.optuna.storage import open_storage
from opbench.exceptions import OpBenchError
from opbench.testing.lan import free_port

ASK_TELL = textwrap.dedent("""
    import sys, optuna
    from opbench.engines.optuna.storage import open_storage
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="shared", storage=open_storage(sys.argv[1]))
    for _ in range(15):
        trial = study.ask({"x": optuna.distributions.IntDistribution(0, 1000)})
        trial.set_user_attr("worker", sys.argv[2])
        study.tell(trial, trial.params["x"])
""")


def test_processes_appending_at_once_leave_a_journal_every_reader_replays(tmp_path):
    path = str(tmp_path / "optuna-journal.log")
    optuna.create_study(study_name="shared", storage=open_storage(path))
    workers = [subprocess.Popen([sys.executable, "-c", ASK_TELL, path, str(i)]) for i in range(3)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0, 0]
    trials = optuna.load_study(study_name="shared", storage=open_storage(path)).trials
    assert len(trials) == 45 and sorted(t.number for t in trials) == list(range(45))
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.value == t.params["x"] for t in trials)
    assert sorted(t.user_attrs["worker"] for t in trials) == sorted(["0", "1", "2"] * 15)


def test_a_writer_killed_while_holding_the_journal_lock_does_not_block_the_next(tmp_path):
    path = tmp_path / "optuna-journal.log"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, time
        f = open({str(path)!r}, "ab")
        fcntl.flock(f, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    # in a process of its own, so that a wait on the dead holder's lock (Optuna's own lock file would
    # stay for its 30 s grace period) fails the test instead of hanging it
    subprocess.run([sys.executable, "-c", "from opbench.engines.optuna.journal_file import JournalFile; "
                    f"JournalFile({str(path)!r}).append_logs([{{'op_code': 0, 'study_name': 'after', 'directions': [1]}}])"],
                   check=True, timeout=10)
    assert optuna.get_all_study_names(open_storage(str(path))) == ["after"]


def test_a_sqlite_url_gets_wal_and_unknown_schemes_are_refused(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'o.db'}")
    with storage.engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(sqlalchemy.text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    with pytest.raises(OpBenchError, match="'redis' is not a database Optuna stores studies in"):
        open_storage("redis://localhost:6379")


def test_optuna_dashboard_opens_the_journal_file(tmp_path):
    path = str(tmp_path / "optuna-journal.log")
    study = optuna.create_study(study_name="seen", storage=open_storage(path))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    port = free_port()
    dashboard = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"), path, "--host", "127.0.0.1",
                                  "--port", str(port), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        summaries = _get_json(f"http://127.0.0.1:{port}/api/studies", dashboard)["study_summaries"]
        assert [s["study_name"] for s in summaries] == ["seen"]
        trials = _get_json(f"http://127.0.0.1:{port}/api/studies/{summaries[0]['study_id']}", dashboard)["trials"]
        assert [t["state"] for t in trials] == ["Complete"] * 3
    finally:
        dashboard.kill()
        dashboard.wait()


def _get_json(url: str, server: subprocess.Popen, timeout_s: float = 60) -> dict:
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        except OSError:
            assert server.poll() is None, server.stderr.read().decode()[-2000:] if server.stderr else ""
            assert time.time() < deadline, f"{url} did not answer within {timeout_s} s"
            time.sleep(0.3)


def test_a_lost_connection_is_an_outage_however_it_is_wrapped_and_a_bad_query_is_not():
    """psycopg2 reports some lost connections as plain DatabaseErrors; SQLAlchemy's dialect marks them
    (connection_invalidated) and Optuna wraps them in a StorageInternalError."""
    import sqlalchemy.exc

    from opbench.engines.optuna.storage import is_outage

    def wrapped(error: Exception) -> Exception:
        try:
            try:
                raise error
            except sqlalchemy.exc.SQLAlchemyError as exc:
                raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from exc
        except optuna.exceptions.StorageInternalError as outer:
            return outer

    lost = sqlalchemy.exc.DatabaseError("SELECT 1", {}, Exception("could not receive data from server"),
                                        connection_invalidated=True)
    assert is_outage(wrapped(lost))
    assert is_outage(wrapped(sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))))
    assert not is_outage(wrapped(sqlalchemy.exc.DataError("INSERT", {}, Exception("value too long"))))


def test_a_trial_another_process_abandoned_is_told_from_its_log_not_measured_again(tmp_path):
    """A process of this host died between logging a trial's record and telling Optuna: the process that
    finds it gone tells that record (it was measured) instead of failing the trial and queueing it again."""
    from opbench.engines.optuna.engine import ASKED_BY, OptunaEngine
    from opbench.record import Status
    from opbench.testing.engine_contract import TEMPLATE, WORKLOAD

    space, storage = TEMPLATE.search_space(WORKLOAD), f"sqlite:///{tmp_path / 'o.db'}"
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid is no process's now
    asking = OptunaEngine(space, 1, "s", storage, seed=0, budget=4)
    logged, lost = asking.ask(2)
    for proposal in (logged, lost):  # the dead one asked them
        asking.study._storage.set_trial_user_attr(proposal.handle._trial_id, ASKED_BY, [socket.gethostname(), dead.pid])
        asking.study._storage.set_trial_user_attr(proposal.handle._trial_id, "pid", dead.pid)
    record = {"trial_id": "t-logged", "status": Status.OK.value, "latency_ms": 1.25, "threads": 1}
    finder = OptunaEngine(space, 1, "s", storage, seed=0, resume=True, budget=4)
    finder.logged_by = lambda pid: {str(logged.handle.number): record} if pid == dead.pid else {}
    assert finder._fail_abandoned(finder.study.get_trials(deepcopy=False))
    told, failed = (finder.study.trials[p.handle.number] for p in (logged, lost))
    assert told.state == optuna.trial.TrialState.COMPLETE and told.values == [1.25]
    assert told.user_attrs["trial_id"] == "t-logged" and "rejected" not in told.user_attrs
    assert failed.state == optuna.trial.TrialState.FAIL and "died" in failed.user_attrs["rejected"]
    assert finder.study.trials[-1].state == optuna.trial.TrialState.WAITING  # its params queued again


def test_a_sigterm_while_a_trial_is_asked_ends_the_process_once_the_trial_is_claimed(tmp_path, monkeypatch):
    """`tune`'s workers end on SIGTERM when it is killed: one that is asking for a trial then still marks
    the trial with its host and pid before it ends, so the resume settles it at once instead of waiting
    for it to go stale (30 s)."""
    from opbench.engines.optuna.engine import OptunaEngine
    from opbench.lifecycle import exit_on_sigterm
    from opbench.testing.engine_contract import TEMPLATE, WORKLOAD

    engine = OptunaEngine(TEMPLATE.search_space(WORKLOAD), 1, "s", f"sqlite:///{tmp_path / 'o.db'}", seed=0, budget=4)
    ask = engine._ask_owned

    def ask_then_terminated():
        trial = ask()
        os.kill(os.getpid(), signal.SIGTERM)  # as the dying parent's PR_SET_PDEATHSIG sends it
        return trial

    monkeypatch.setattr(engine, "_ask_owned", ask_then_terminated)
    before = signal.getsignal(signal.SIGTERM)
    exit_on_sigterm()
    try:
        with pytest.raises(SystemExit) as ended:
            engine.ask(1)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert ended.value.code == 128 + signal.SIGTERM
    (trial,) = engine.study.get_trials(deepcopy=False)
    assert trial.state == optuna.trial.TrialState.RUNNING
    assert trial.user_attrs["pid"] == os.getpid() and "host" in trial.user_attrs


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing after it runs."""


def test_a_process_killed_while_the_sampler_picks_leaves_a_trial_the_next_one_settles_at_once(tmp_path, monkeypatch):
    """The trial carries the asking host and pid from its creation (``asked_by``): killed before it marked the
    trial as its own, a process leaves one the next process on the host settles at once as abandoned (its
    pid is gone), not an orphan without a host that it would leave to the stale timeout."""
    from opbench.engines.optuna.engine import ASKED_BY, OptunaEngine
    from opbench.testing.engine_contract import TEMPLATE, WORKLOAD

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    killed = OptunaEngine(TEMPLATE.search_space(WORKLOAD), 1, "s", storage, seed=0, budget=4)
    def killed_while_picking(*_args: object) -> None:
        raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(optuna.trial.Trial, "_suggest", killed_while_picking)
        with pytest.raises(_Killed):
            killed.ask(1)
    (trial,) = killed.study.get_trials(deepcopy=False)
    assert trial.state == optuna.trial.TrialState.RUNNING and not trial.params  # killed before any param was picked
    assert trial.user_attrs[ASKED_BY] == [socket.gethostname(), os.getpid()] and "host" not in trial.user_attrs
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now: the asking process's, once it was killed
    killed.study._storage.set_trial_user_attr(trial._trial_id, ASKED_BY, [socket.gethostname(), gone.pid])
    engine = OptunaEngine(TEMPLATE.search_space(WORKLOAD), 1, "s", storage, seed=0, budget=4, resume=True)
    (proposal,) = engine.ask(1)
    settled = engine.study.get_trials(deepcopy=False)[trial.number]
    assert settled.state == optuna.trial.TrialState.FAIL and f"(pid {gone.pid}) died" in settled.user_attrs["rejected"]
    assert proposal.handle.number != trial.number


def test_a_storage_call_rides_an_outage_then_names_the_masked_url_and_a_bad_query_is_raised_at_once(monkeypatch):
    from opbench.engines.optuna import storage as optuna_storage
    from opbench.exceptions import StorageUnavailable

    url = "postgresql://opbench:s3cret@db.example:5432/studies"
    monkeypatch.setattr(optuna_storage, "_last_recovery", -float("inf"))
    answers = iter([sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))] * 2 + ["ok"])

    def away_twice() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert optuna_storage.riding_outages(away_twice, url, limit_s=60) == "ok"
    assert optuna_storage.recovered_within(60)

    calls = []

    def refused() -> None:
        calls.append(1)
        raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))

    with pytest.raises(StorageUnavailable, match=r"unreachable for 0 s .*--resume") as raised:
        optuna_storage.riding_outages(refused, url, limit_s=0)
    assert "s3cret" not in str(raised.value) and "db.example" in str(raised.value) and len(calls) == 1

    def bad_query() -> None:
        calls.append(1)
        raise sqlalchemy.exc.DataError("INSERT", {}, Exception("value too long"))

    with pytest.raises(sqlalchemy.exc.DataError):
        optuna_storage.riding_outages(bad_query, url, limit_s=60)
    assert len(calls) == 2
