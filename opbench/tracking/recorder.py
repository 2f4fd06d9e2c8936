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
from opbench.record import Record, is_ok
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
        self.records: list[Record] = []
        self.segments = SegmentBuffer()
        self._timer: threading.Timer | None = None
        self._sealing = threading.Lock()  # a timer's seal and the invocation's end never interleave
        self.recovered = self._replay() if parent_run_id else []
        self._best = (self.mlflow.parent_metric("best_latency_ms") or math.inf) if best_so_far else None

    def __call__(self, record: Record) -> None:
        record.update(self.extra)
        self.wal.append(record)
        if self.jsonl:
            self.jsonl.write(record)
        self.mlflow.write(record)
        first = self.segments.add(record)
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
                                   tags={"best_trial_id": record["trial_id"]},
                                   step=_step(record, len(self.records)))

    def _replay(self) -> list[Record]:
        """The records this invocation's dead processes logged ahead, after writing those MLflow lacks
        and sealing those no segment holds (the dead writers are then sealed)."""
        with replaying(self.wal.directory):
            logs = dead_processes_logs(self.wal.directory)
            logged = {str(r.get("trial_id")): r for records in logs.values() for r in records}
            written = self.mlflow.written_trial_ids() if logged else set()
            for key, record in logged.items():
                if key not in written:
                    self.mlflow.write(record)
            if logs:
                with tempfile.TemporaryDirectory(prefix="opbench-segments-") as scratch:
                    sealed = sealed_trial_ids(self.mlflow.client, self.mlflow.parent_run_id, Path(scratch))
                self.mlflow.held_in_segments(list(sealed))
                self.mlflow.seal([canonical(r) for key, r in logged.items() if key not in sealed])
                self.mlflow.mark_sealed([writer_name(host, pid) for host, pid in logs])
            self.mlflow.flush()  # in MLflow before another process looks
        return list(logged.values())

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


def _step(record: Record, count: int) -> int:
    number = str(record.get("engine_trial", ""))
    return int(number) if number.isdigit() else count
