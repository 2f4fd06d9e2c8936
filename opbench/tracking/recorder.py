"""Sends each record to every sink of a study: the write-ahead log (always, on disk before anything
else hears of the record), a JSON-lines log (optional) and MLflow (always; in a background thread when
given the host timing lock)."""
from __future__ import annotations

import math
import tempfile
import threading
from pathlib import Path
from typing import Any

from opbench.hardware.lock import HostLock
from opbench.record import TrialRecord, is_ok
from opbench.tracking.jsonl import JsonlWriter
from opbench.tracking.mlflow_store import MlflowWriter, study_dir
from opbench.tracking.segment_store import sealed_trial_ids, writer_name
from opbench.tracking.segments import SegmentBuffer, canonical
from opbench.tracking.wal import WriteAheadLog, dead_processes_logs, replaying


class Recorder:
    """Records of one invocation of a study (one MLflow parent run: a new one, or ``parent_run_id``'s,
    ``reopen``ed when the invocation is resumed). Joining an existing parent run replays the write-ahead
    logs its dead processes left on this host: :attr:`recovered` are their records (an engine not told
    of them hears them on resume), those MLflow lacked are written to it, those no segment holds sealed.
    The records this process writes are sealed into segments (``segments``) as they come and at the end.

    With ``best_so_far``, each new best ok trial also goes to the parent run: ``best_latency_ms`` and
    ``best_gflops`` at the trial's step (a numeric ``engine_trial``, else the count of records), ``best_trial_id``."""

    def __init__(self, study: str, tracking_uri: str | None = None, log: Path | str | None = None,
                 extra: dict[str, Any] | None = None, parent_tags: dict[str, str] | None = None,
                 parent_run_id: str | None = None, background_lock: HostLock | None = None,
                 best_so_far: bool = False, reopen: bool = False) -> None:
        self.study = study
        self.extra = {"study": study, **(extra or {})}  # stamped on every record (engine, ...)
        self.mlflow = MlflowWriter(study, tracking_uri, parent_tags=parent_tags, parent_run_id=parent_run_id,
                                   background_lock=background_lock, reopen=reopen)
        self.wal = WriteAheadLog(study_dir("wal", study, self.mlflow.uri) / self.mlflow.parent_run_id)
        self.jsonl = JsonlWriter(log) if log else None
        self.records: list[TrialRecord] = []
        self.segments = SegmentBuffer()
        self._timer: threading.Timer | None = None
        self._sealing = threading.Lock()  # a timer's seal and the invocation's end never interleave
        self.recovered = self._replay() if parent_run_id else []
        self._best = (self.mlflow.parent_metric("best_latency_ms") or math.inf) if best_so_far else None

    def __call__(self, record: TrialRecord) -> None:
        record.set(**self.extra)
        row = record.to_row()
        self.wal.append(row)
        if self.jsonl:
            self.jsonl.write(row)
        self.mlflow.write(row)
        first = self.segments.add(row)
        if self.segments.due():
            self.seal()
        elif first:  # sealed when it is due by age, even if no other record comes
            self._timer = threading.Timer(self.segments.max_age_s, self.seal)
            self._timer.daemon = True
            self._timer.start()
        self.records.append(record)
        if self._best is not None and is_ok(record) and not record.get("reference") and record["latency_ms"] < self._best:
            self._best = record["latency_ms"]
            self.mlflow.log_parent(metrics={"best_latency_ms": record["latency_ms"], "best_gflops": record["gflops"]},
                                   tags={"best_trial_id": record.trial_id},
                                   step=_step(record, len(self.records)))

    def _replay(self) -> list[TrialRecord]:
        """The records this invocation's dead processes logged ahead, after writing those MLflow lacks
        and sealing those no segment holds (the dead writers are then sealed)."""
        with replaying(self.wal.directory):
            logs = dead_processes_logs(self.wal.directory)
            logged = {r.trial_id: r for records in logs.values() for r in records}
            written = self.mlflow.written_trial_ids() if logged else set()
            for key, record in logged.items():
                if key not in written:
                    self.mlflow.write(record.to_row())
            if logs:
                with tempfile.TemporaryDirectory(prefix="opbench-segments-") as scratch:
                    sealed = sealed_trial_ids(self.mlflow.client, self.mlflow.parent_run_id, Path(scratch))
                self.mlflow.held_in_segments(list(sealed))
                self.mlflow.seal([canonical(r.to_row()) for key, r in logged.items() if key not in sealed])
                self.mlflow.mark_sealed([writer_name(host, pid) for host, pid in logs])
            self.mlflow.flush()  # in MLflow before another process looks
        return list(logged.values())

    @property
    def uri(self) -> str:
        """The tracking URI the study is recorded in."""
        return self.mlflow.uri

    @property
    def parent_run_id(self) -> str:
        """This invocation's parent run."""
        return self.mlflow.parent_run_id

    def log_parent(self, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
                   tags: dict[str, str] | None = None) -> None:
        """Study-level params, metrics and tags (references, results, verification) on the parent run."""
        self.mlflow.log_parent(params, metrics, tags)

    def log_artifact(self, path: Path | str, folder: str | None = None, trial_id: str | None = None) -> None:
        """Attach a file (a plot, a report) to the parent run, or to the run of the trial ``trial_id``."""
        self.mlflow.log_artifact(path, folder, trial_id)

    def folder(self, kind: str) -> Path:
        """The study's folder of ``kind`` (plots, reports, tuner state) beside the store."""
        return study_dir(kind, self.study, self.uri)

    def flush(self) -> None:
        """Every record and summary handed over so far is in MLflow when this returns."""
        self.mlflow.flush()

    def seal(self) -> None:
        """Seal what this process wrote since its last segment (an invocation's end does it too)."""
        with self._sealing:
            if self._timer is not None:
                self._timer.cancel()
            self.mlflow.seal(self.segments.take())

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.seal()
        with self._sealing:
            self.mlflow.close("FAILED" if exc_type else "FINISHED")


def _step(record: TrialRecord, count: int) -> int:
    number = str(record.get("engine_trial", ""))
    return int(number) if number.isdigit() else count
