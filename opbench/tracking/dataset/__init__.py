"""Tuning logs as datasets: streamed export, lossless import that merges, a dataset card."""
from __future__ import annotations

from opbench.tracking.dataset.export import card, export_mlflow, load_records, read_dataset, write_dataset

__all__ = ["card", "export_mlflow", "load_records", "read_dataset", "write_dataset"]
