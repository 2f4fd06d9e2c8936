"""The one store interface: records written (a :class:`Recorder` per invocation of a study: the write-ahead log,
MLflow runs, segments and an optional JSON-lines log behind it), a study's parent run and artifacts, runs of
their own, and records read back as :class:`~opbench.record.TrialRecord` or pandas. Nothing above this layer
touches MLflow."""
from __future__ import annotations

from opbench.record import SCHEMA_VERSION
from opbench.tracking.jsonl import JsonlWriter, read_jsonl, read_jsonl_records
from opbench.tracking.mlflow_read import latest_parent_run, read_mlflow, read_mlflow_records, verified_claims
from opbench.tracking.mlflow_store import KIND_TAG, MlflowWriter, default_tracking_uri, study_dir
from opbench.tracking.recorder import Recorder
from opbench.tracking.row import Row
from opbench.tracking.runs import log_run
from opbench.tracking.ui import how_to_open, runs_url, serve_ui, ui_address

__all__ = ["KIND_TAG", "JsonlWriter", "MlflowWriter", "Recorder", "Row", "SCHEMA_VERSION", "default_tracking_uri",
           "latest_parent_run", "log_run", "read_jsonl", "read_jsonl_records", "read_mlflow", "read_mlflow_records",
           "how_to_open", "runs_url", "serve_ui", "study_dir", "ui_address", "verified_claims"]
