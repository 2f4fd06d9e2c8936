"""One invocation of a study (one MLflow parent run) as the processes that take part in it see it: its
records by engine trial, and what a dead process of this host logged ahead."""
from __future__ import annotations

from opbench.engines._base import Engine
from opbench.engines.loop import ENGINE_TRIAL_TAG
from opbench.engines.optuna.engine import OptunaEngine
from opbench.record import TrialRecord
from opbench.tracking import Recorder, read_mlflow_records
from opbench.tracking.wal import logged_by


def engine_trials(records: list[TrialRecord]) -> dict[str, TrialRecord]:
    """The engine's trials among ``records``, keyed by ``engine_trial``."""
    return {str(r[ENGINE_TRIAL_TAG]): r for r in records if r.get(ENGINE_TRIAL_TAG) is not None}


def invocation_records(recorder: Recorder) -> list[TrialRecord]:
    """The records of the recorder's invocation (its parent run) in MLflow, oldest first."""
    recorder.flush()
    return read_mlflow_records([recorder.study], recorder.uri, recorder.parent_run_id)


def told_from_logs(engine: Engine, recorder: Recorder) -> None:
    """An Optuna engine settles a trial another process of this host abandoned from that process's
    write-ahead log: told its record when it logged one, never measured again."""
    if isinstance(engine, OptunaEngine):
        engine.logged_by = lambda pid: engine_trials(logged_by(recorder.wal.directory, pid))


def joined_hosts_records(recorder: Recorder, known: list[TrialRecord]) -> list[TrialRecord]:
    """The engine trials other processes (``--workers``, ``opbench worker`` on other hosts) logged to
    the recorder's parent run."""
    seen = {r["trial_id"] for r in known}
    return [r for r in engine_trials(invocation_records(recorder)).values() if r["trial_id"] not in seen]
