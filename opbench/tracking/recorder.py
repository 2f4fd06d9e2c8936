"""Sends each record to every sink of a study: a JSON-lines log (optional, written at once) and MLflow
(always; in a background thread when given the host timing lock)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from opbench.measure.lock import HostLock
from opbench.record import Record
from opbench.tracking.jsonl import JsonlWriter
from opbench.tracking.mlflow_store import MlflowWriter


class Recorder:
    def __init__(self, study: str, tracking_uri: str | None = None, log: Path | str | None = None,
                 extra: dict[str, Any] | None = None, parent_tags: dict[str, str] | None = None,
                 parent_run_id: str | None = None, background_lock: HostLock | None = None) -> None:
        self.study = study
        self.extra = {"study": study, **(extra or {})}  # stamped on every record (engine, ...)
        self.mlflow = MlflowWriter(study, tracking_uri, parent_tags=parent_tags, parent_run_id=parent_run_id,
                                   background_lock=background_lock)
        self.jsonl = JsonlWriter(log) if log else None
        self.records: list[Record] = []

    def __call__(self, record: Record) -> None:
        record.update(self.extra)
        if self.jsonl:
            self.jsonl.write(record)
        self.mlflow.write(record)
        self.records.append(record)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.mlflow.close("FAILED" if exc_type else "FINISHED")
