"""One row per trial, from MLflow (streamed from segments) or JSON-lines logs, filtered, to Parquet, JSON lines
or CSV; and the table of some studies as a DataFrame (:func:`load_records`)."""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.paths import default_tracking_uri
from opbench.record import FEATURE_PREFIX, KNOB_PREFIX
from opbench.tracking.dataset.formats import FORMATS, open_writer, read_rows
from opbench.tracking.dataset.open_dataset import read_open_dataset
from opbench.tracking.dataset.sources import Filters, conform, fetch, plan
from opbench.tracking.row import Row
from opbench.tracking.segments import table_records

CARD_COLUMNS = ("op", "host", "status", "study")


def all_experiments(tracking_uri: str | None) -> list[str]:
    from opbench.tracking.mlflow_store import _client

    return [e.name for e in _client(tracking_uri or default_tracking_uri()).search_experiments()
            if e.name != "Default"]


@dataclass
class Exported:
    """What an export wrote: rows, where they came from, and what a dataset card says of them."""

    rows: int = 0
    segments: int = 0
    read_run_by_run: int = 0
    workloads: set[str] = field(default_factory=set)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)

    def count(self, table: Any) -> None:
        self.rows += len(table)
        if "workload" in table.column_names:
            self.workloads.update(str(w) for w in table.column("workload").unique().to_pylist())
        for name in CARD_COLUMNS:
            if name in table.column_names:
                seen = self.counts.setdefault(name, {})
                for item in table.column(name).value_counts().to_pylist():
                    seen[str(item["values"])] = seen.get(str(item["values"]), 0) + item["counts"]


def export_mlflow(out: Path | str, experiments: Sequence[str] = (), tracking_uri: str | None = None,
                  filters: Filters | None = None) -> Exported:
    """Stream the records of ``experiments`` (every study in the store when none is named) to ``out``:
    each segment read, filtered and written before the next (memory stays bounded), then what no
    segment holds, read run by run."""
    uri = tracking_uri or default_tracking_uri()
    filters = filters or Filters()
    store = plan(list(experiments) or all_experiments(uri), uri)
    with tempfile.TemporaryDirectory(prefix="opbench-export-") as scratch:
        fetched = fetch(store, filters.kind, Path(scratch))
        schema = fetched.schema()
        done = Exported(segments=len(fetched.segments), read_run_by_run=sum(len(t) for t in fetched.runs),
                        columns=schema.names)
        with open_writer(Path(out), schema) as writer:
            for table in fetched.tables(filters):
                writer.write(conform(table, schema))
                done.count(table)
    return done


def load_records(source: str = "mlflow", experiments: Sequence[str] = (), logs: Sequence[Path | str] = (),
                 tracking_uri: str | None = None, status: Sequence[str] = (), ops: Sequence[str] = (),
                 hosts: Sequence[str] = (), kind: str = "trial") -> pd.DataFrame:
    """The record table of some studies (every study in the store when none is named), filtered, as a
    DataFrame. ``kind="corun"`` gives the co-runs' own records (makespan, throughput) instead of trials."""
    from opbench.tracking.jsonl import records_frame

    filters = Filters(tuple(status), tuple(ops), tuple(hosts), kind)
    return records_frame(read_records(source, experiments, logs, tracking_uri, filters))


def read_records(source: str, experiments: Sequence[str], logs: Sequence[Path | str], tracking_uri: str | None,
                 filters: Filters) -> list[Row]:
    """The records of some studies in MLflow (``source`` mlflow) or of JSON-lines logs (jsonl), filtered."""
    if source == "mlflow":
        uri = tracking_uri or default_tracking_uri()
        store = plan(list(experiments) or all_experiments(uri), uri)
        with tempfile.TemporaryDirectory(prefix="opbench-read-") as scratch:
            return [r for table in fetch(store, filters.kind, Path(scratch)).tables(filters) for r in table_records(table)]
    if source != "jsonl":
        raise OpBenchError(f"unknown dataset source '{source}'; sources: mlflow, jsonl")
    if not logs:
        raise OpBenchError("--from jsonl needs at least one --log FILE.jsonl")
    missing = [str(p) for p in logs if not Path(p).is_file()]
    if missing:
        raise OpBenchError(f"JSON-lines log(s) not found: {', '.join(missing)}")
    return [r for path in logs for r in read_rows(Path(path), filters)]


def write_dataset(frame: pd.DataFrame, path: Path | str) -> Path:
    """A DataFrame of records to ``path``, in the format its suffix names (``FORMATS``)."""
    from opbench.tracking.segments import canonical, to_table

    path = Path(path)
    table = to_table([canonical(row) for row in frame.to_dict("records")])  # canonical drops None and NaN
    with open_writer(path, table.schema) as writer:
        writer.write(table)
    return path


def read_dataset(path: Path | str) -> pd.DataFrame:
    """A dataset file (Parquet, JSON lines or CSV), or a folder of Parquet partitions (the open dataset), as a
    DataFrame."""
    from opbench.tracking.jsonl import records_frame

    path = Path(path)
    if path.is_dir():
        frame = read_open_dataset(path)
        if not len(frame):
            raise OpBenchError(f"{path}: a folder read as a dataset holds Parquet partitions (device=<key>/*.parquet)")
        return frame
    if not path.is_file():
        raise OpBenchError(f"dataset not found: {path}")
    if path.suffix not in FORMATS:
        raise OpBenchError(f"{path}: dataset files are {', '.join(FORMATS)}")
    try:
        if path.suffix == ".jsonl":
            return records_frame(read_rows(path, None))
        return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise OpBenchError(f"{path}: not a readable {path.suffix[1:]} dataset ({str(exc).splitlines()[0][:200]})") from None


def card(frame: pd.DataFrame) -> str:
    """A short description of a dataset: size, what it covers, which columns it has."""
    exported = Exported(rows=len(frame), columns=list(frame.columns))
    exported.workloads = set(frame["workload"].astype(str)) if "workload" in frame else set()
    for name in CARD_COLUMNS:
        if name in frame:
            exported.counts[name] = {str(k): int(v) for k, v in frame[name].value_counts().items()}
    return describe(exported)


def describe(exported: Exported) -> str:
    """The dataset card of what an export wrote."""
    def counts(column: str) -> str:
        seen = exported.counts.get(column, {})
        return ", ".join(f"{k} {v}" for k, v in sorted(seen.items(), key=lambda kv: -kv[1])) or "-"

    knobs = sum(c.startswith(KNOB_PREFIX) for c in exported.columns)
    feats = sum(c.startswith(FEATURE_PREFIX) for c in exported.columns)
    return "\n".join([
        f"rows: {exported.rows}   workloads: {len(exported.workloads)}",
        f"ops: {counts('op')}",
        f"hosts: {counts('host')}",
        f"statuses: {counts('status')}",
        f"studies: {counts('study')}",
        f"columns: {len(exported.columns)} ({knobs} knob.*, {feats} feat.*, {len(exported.columns) - knobs - feats} others)",
    ])


__all__ = ["FORMATS", "Exported", "card", "describe", "export_mlflow", "load_records", "read_dataset", "write_dataset"]
