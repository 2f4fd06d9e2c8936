"""One row per trial from MLflow or JSON-lines logs, filtered, written as Parquet or CSV."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.record import FEATURE_PREFIX, KNOB_PREFIX


def _all_experiments(tracking_uri: str | None) -> list[str]:
    from opbench.tracking.mlflow_store import _client, default_tracking_uri

    return [e.name for e in _client(tracking_uri or default_tracking_uri()).search_experiments()
            if e.name != "Default"]


def load_records(source: str = "mlflow", experiments: Sequence[str] = (), logs: Sequence[Path | str] = (),
                 tracking_uri: str | None = None, status: Sequence[str] = (), ops: Sequence[str] = (),
                 hosts: Sequence[str] = (), kind: str = "trial") -> pd.DataFrame:
    """The record table of some studies (every study in the store when none is named), filtered.
    ``kind="corun"`` gives the co-runs' own records (makespan, throughput) instead of trials."""
    from opbench.tracking import read_jsonl, read_mlflow

    if source == "mlflow":
        frame = read_mlflow(list(experiments) or _all_experiments(tracking_uri), tracking_uri, kind=kind)
    elif source == "jsonl":
        if not logs:
            raise OpBenchError("--from jsonl needs at least one --log FILE.jsonl")
        missing = [str(p) for p in logs if not Path(p).is_file()]
        if missing:
            raise OpBenchError(f"JSON-lines log(s) not found: {', '.join(missing)}")
        frame = read_jsonl(*logs)
        kinds = frame["record_kind"].fillna("trial") if "record_kind" in frame else pd.Series("trial", frame.index)
        frame = frame[kinds == kind]
    else:
        raise OpBenchError(f"unknown dataset source '{source}'; sources: mlflow, jsonl")
    for column, wanted in (("status", status), ("op", ops), ("host", hosts)):
        if wanted and column in frame:
            frame = frame[frame[column].isin(wanted)]
    return frame.reset_index(drop=True)


def write_dataset(frame: pd.DataFrame, path: Path | str) -> Path:
    """Parquet (``.parquet``) or CSV (``.csv``) by the file's suffix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        raise OpBenchError(f"{path}: dataset files are .parquet or .csv")
    return path


def read_dataset(path: Path | str) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise OpBenchError(f"dataset not found: {path}")
    if path.suffix not in (".parquet", ".csv"):
        raise OpBenchError(f"{path}: dataset files are .parquet or .csv")
    try:
        return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise OpBenchError(f"{path}: not a readable {path.suffix[1:]} dataset ({str(exc).splitlines()[0][:200]})") from None


def card(frame: pd.DataFrame) -> str:
    """A short description of a dataset: size, what it covers, which columns it has."""
    def counts(column: str) -> str:
        if column not in frame or frame.empty:
            return "-"
        return ", ".join(f"{k} {v}" for k, v in frame[column].value_counts().items())

    columns = list(frame.columns)
    knobs = sum(c.startswith(KNOB_PREFIX) for c in columns)
    feats = sum(c.startswith(FEATURE_PREFIX) for c in columns)
    return "\n".join([
        f"rows: {len(frame)}   workloads: {frame['workload'].nunique() if 'workload' in frame else 0}",
        f"ops: {counts('op')}",
        f"hosts: {counts('host')}",
        f"statuses: {counts('status')}",
        f"studies: {counts('study')}",
        f"columns: {len(columns)} ({knobs} knob.*, {feats} feat.*, {len(columns) - knobs - feats} others)",
    ])
