"""Tuning logs as datasets: export with filters, a dataset card, and MetaSchedule logs imported as records."""
from __future__ import annotations

from opbench.tracking.dataset.export import card, load_records, read_dataset, write_dataset

__all__ = ["card", "load_records", "read_dataset", "write_dataset"]
