"""Records, their JSON-lines log and MLflow store, and reading them back as pandas."""
from __future__ import annotations

from opbench.record import SCHEMA_VERSION, Record
from opbench.tracking.jsonl import JsonlWriter, read_jsonl, read_jsonl_records
from opbench.tracking.mlflow_read import read_mlflow, read_mlflow_records
from opbench.tracking.mlflow_store import MlflowWriter, default_tracking_uri
from opbench.tracking.recorder import Recorder

__all__ = ["JsonlWriter", "MlflowWriter", "Recorder", "Record", "SCHEMA_VERSION", "default_tracking_uri",
           "read_jsonl", "read_jsonl_records", "read_mlflow", "read_mlflow_records"]
