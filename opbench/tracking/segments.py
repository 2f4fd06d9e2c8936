"""Sealed segments: a process's records as Parquet files, the form datasets are read in at scale.

A segment holds up to ``SEGMENT_RECORDS`` records, each as MLflow gives it back (:func:`canonical`), one
row group per workload (readers that filter on ``workload`` or ``task_key`` skip the others). Each
column's type follows from its name (:func:`arrow_column`), so segments written anywhere read together;
a knob that holds both numbers and words in one segment is stored as words.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from opbench.record import JSON_TAGS, KNOB_PREFIX, from_mlflow_value, is_numeric
from opbench.tracking.row import Row, column_order

SEGMENT_RECORDS = 512  # a segment is sealed at this many records ...
SEGMENT_SECONDS = 300.0  # ... or this long after its first record, whichever comes first
SEGMENTS_DIR = "segments"  # under the invocation's parent run's artifacts: segments/host=<host>/<file>.parquet
INT_COLUMNS = ("schema_version", "threads", "cache_flush", "worker_pid", "kernel_pid", "verify_round")


def canonical(record: Row) -> Row:
    """``record`` exactly as MLflow gives it back (what every reader returns): None and NaN left out,
    params and tags as strings, but for the integer columns and knobs that read as integers."""
    out: Row = {}
    for key, value in record.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if key in JSON_TAGS:
            out[key] = [float(v) for v in value]
        elif is_numeric(key):
            out[key] = float(value)
        else:
            out[key] = from_mlflow_value(key, str(value))  # MLflow keeps params and tags as str(value)
    return out


def arrow_column(name: str, values: list[Any]) -> Any:
    """The Arrow array of one column: lists of floats, floats, integers or strings by the column's name;
    a knob's by its values (words where they mix)."""
    import pyarrow as pa

    if name in JSON_TAGS:
        return pa.array(values, pa.list_(pa.float64()))
    if is_numeric(name):
        return pa.array(values, pa.float64())
    if name in INT_COLUMNS:
        return pa.array(values, pa.int64())
    if name.startswith(KNOB_PREFIX) and all(v is None or _is_int64(v) for v in values):
        return pa.array(values, pa.int64())
    return pa.array([None if v is None else str(v) for v in values], pa.string())


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


def to_table(rows: list[Row]) -> Any:
    """Canonical rows as one Arrow table, columns in the dataset's order."""
    import pyarrow as pa

    names = column_order(sorted({k for row in rows for k in row}))
    return pa.table({name: arrow_column(name, [row.get(name) for row in rows]) for name in names})


def write_segment(rows: list[Row], path: Path) -> Path:
    """Canonical rows as a Parquet segment at ``path``, a row group per workload (written whole or not at all)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: str(r.get("workload", "")))  # stable: oldest first within a workload
    table = to_table(rows)
    partial = path.with_name(f".{path.name}.partial")
    with pq.ParquetWriter(partial, table.schema) as writer:
        start = 0
        for size in _run_lengths(str(r.get("workload", "")) for r in rows):
            writer.write_table(table.slice(start, size))
            start += size
    partial.rename(path)
    return path


def _run_lengths(keys: Iterable[str]) -> Iterator[int]:
    last, count = None, 0
    for key in keys:
        if count and key != last:
            yield count
            count = 0
        last, count = key, count + 1
    if count:
        yield count


def read_segment(path: Path | str, columns: list[str] | None = None) -> Any:
    """A segment as an Arrow table (only ``columns`` that it has, when given)."""
    import pyarrow.parquet as pq

    if columns is not None:
        have = set(pq.read_schema(path).names)
        columns = [c for c in columns if c in have]
    return pq.read_table(path, columns=columns)


def trial_ids(paths: Iterable[Path]) -> set[str]:
    """The trial ids segments hold (only that column read)."""
    return {str(t) for path in paths for t in read_segment(path, ["trial_id"]).column("trial_id").to_pylist()
            if t is not None}


def table_records(table: Any) -> list[Row]:
    """An Arrow table's rows as records (absent values left out; a knob stored as words where its column
    mixes them with numbers reads back as :func:`canonical` gives it)."""
    knobs = [name for name in table.column_names if name.startswith(KNOB_PREFIX)]
    rows = []
    for row in table.to_pylist():
        record = {k: v for k, v in row.items() if v is not None}
        for name in knobs:
            if isinstance(record.get(name), str):
                record[name] = from_mlflow_value(name, record[name])
        rows.append(record)
    return rows


class SegmentBuffer:
    """The records this process wrote since its last segment, and when the next one is due (thread-safe:
    a timer may take them)."""

    def __init__(self, max_records: int = SEGMENT_RECORDS, max_age_s: float = SEGMENT_SECONDS,
                 clock: Any = time.monotonic) -> None:
        self.max_records, self.max_age_s = max_records, max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: list[Row] = []
        self._since = 0.0

    def add(self, record: Row) -> bool:
        """Keep ``record``; whether it is the first since the last segment."""
        with self._lock:
            if not self._rows:
                self._since = self._clock()
            self._rows.append(canonical(record))
            return len(self._rows) == 1

    def due(self) -> bool:
        with self._lock:
            return len(self._rows) >= self.max_records or bool(self._rows) and self._clock() - self._since >= self.max_age_s

    def take(self) -> list[Row]:
        """The rows to seal, and a fresh start."""
        with self._lock:
            rows, self._rows = self._rows, []
            return rows
