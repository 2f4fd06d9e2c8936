"""JSON-lines log: one record per line, appended and flushed as each trial ends."""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from opbench.record import TrialRecord, is_numeric
from opbench.tracking.row import Row, column_order, json_line


class JsonlWriter:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: TrialRecord | Row) -> None:
        row = record.to_row() if isinstance(record, TrialRecord) else record
        line = json_line(row)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_jsonl_records(*paths: Path | str) -> list[TrialRecord]:
    """Records from JSON-lines logs, oldest first (a torn last line from a killed writer is skipped)."""
    return [TrialRecord.from_row(row) for row in read_jsonl_rows(*paths)]


def read_jsonl_rows(*paths: Path | str) -> list[Row]:
    """The rows of :func:`read_jsonl_records`."""
    rows = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def read_jsonl(*paths: Path | str) -> pd.DataFrame:
    """Records from JSON-lines logs as a DataFrame."""
    return records_frame(read_jsonl_rows(*paths))


def records_frame(records: Iterable[TrialRecord | Row]) -> pd.DataFrame:
    """Records (or their rows) as a DataFrame in canonical column order, with metric columns as floats."""
    rows = [r.to_row() if isinstance(r, TrialRecord) else r for r in records]
    frame = pd.DataFrame(rows)
    if not rows:
        return frame
    frame = frame.astype({column: "float64" for column in frame.columns if is_numeric(column)})  # one block, not one per column
    return frame[column_order(list(frame.columns))].reset_index(drop=True).copy()  # .copy(): one block per dtype
