"""JSON-lines log: one record per line, appended and flushed as each trial ends."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from opbench.record import Record, column_order, is_numeric, to_json_value


class JsonlWriter:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: Record) -> None:
        values = {k: to_json_value(k, v) for k, v in record.items()}
        line = json.dumps({k: v for k, v in values.items() if v is not None}, allow_nan=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_jsonl_records(*paths: Path | str) -> list[Record]:
    """Records from JSON-lines logs, oldest first (a torn last line from a killed writer is skipped)."""
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
    return records_frame(read_jsonl_records(*paths))


def records_frame(rows: list[Record]) -> pd.DataFrame:
    """Records as a DataFrame in canonical column order, with metric columns as floats."""
    frame = pd.DataFrame(rows)
    if not rows:
        return frame
    frame = frame.astype({column: "float64" for column in frame.columns if is_numeric(column)})  # one block, not one per column
    return frame[column_order(list(frame.columns))].reset_index(drop=True).copy()  # .copy(): one block per dtype
