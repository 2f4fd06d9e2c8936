"""The open dataset kept in the repository (``datasets/records/``): OpBench's measurements, one Hive partition per
device key (``device=<key>/part-*.parquet``, the key of :attr:`HostFacts.device_key`, never ``cpu_model``), only the
columns a predictor needs, and a card (``_CARD.md``) saying how they were measured. pandas
(``pd.read_parquet("datasets/records")``) and DuckDB (``read_parquet('datasets/records/*/*.parquet',
hive_partitioning=true)``) read it in place. Nothing in it names a host, a path or an error.

Records are staged as they are measured (``.staging/<device>.jsonl``, flushed each) and compacted into a part file
when a collection ends or the next one starts, so a killed collection loses nothing it measured; a record whose
key (:data:`KEY`) the partition holds already is never added twice."""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import HostFacts, host_facts
from opbench.paths import OPEN_DATASET_DIR, safe_name
from opbench.record import FEATURE_PREFIX, SCHEMA_VERSION, TrialRecord, config_of, is_ok
from opbench.tracking.jsonl import read_jsonl_rows

VERSION = 1  # bumped when a column changes meaning or goes away; a new column does not bump it
IDENTITY = ("workload", "task_key", "op", "template", "dtype", "threads", "cache_state", "status")  # status: ok
LABELS = ("latency_ms", "latency_lo_ms", "latency_hi_ms", "placements", "latency_cv")
PROVENANCE = ("schema_version", "features_version", "tvm_version")
KEY = ("task_key", "template", "threads", "cache_state", "config")  # one measurement of one thing on one device
PARTITION = "device"
STAGING = ".staging"
CARD = "_CARD.md"  # "_": pyarrow (pandas, DuckDB) reads the folder as a dataset and skips it


def dataset_row(record: TrialRecord, device: str, commit: str) -> dict[str, Any]:
    """The columns of ``record`` the dataset keeps (an ok record's), its config as JSON text, where and when."""
    row = record.to_row()
    out = {name: row.get(name) for name in (*IDENTITY, *LABELS, *PROVENANCE)}
    out["cache_state"] = out["cache_state"] or "warm"
    out["config"] = json.dumps(config_of(row), sort_keys=True)
    out.update({key: value for key, value in row.items() if key.startswith(FEATURE_PREFIX)})
    out.update(device_key=device, commit=commit, measured_on=f"{datetime.date.today():%Y-%m-%d}")
    return out


@dataclass
class OpenDataset:
    """The dataset under ``root``, this device's partition written to."""

    root: Path = OPEN_DATASET_DIR
    device: str = field(default_factory=lambda: host_facts().device_key)
    commit: str = "unknown"

    @property
    def partition(self) -> Path:
        return self.root / f"{PARTITION}={safe_name(self.device)}"

    @property
    def staging(self) -> Path:
        return self.root / STAGING / f"{safe_name(self.device)}.jsonl"

    def stage(self, record: TrialRecord) -> None:
        """Keep an ok ``record`` at once (flushed to disk): a kill after this loses nothing of it."""
        if not is_ok(record):
            return
        self.staging.parent.mkdir(parents=True, exist_ok=True)
        with open(self.staging, "a", encoding="utf-8") as out:
            out.write(json.dumps(dataset_row(record, self.device, self.commit)) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def compact(self) -> int:
        """Move the staged rows this partition lacks into a part file of their own; how many were added."""
        if not self.staging.exists():
            return 0
        staged = pd.DataFrame(read_jsonl_rows(self.staging))
        fresh = staged.drop_duplicates(list(KEY)) if len(staged) else staged
        held = self.device_frame()
        if len(held) and len(fresh):
            known = set(_keys(held))
            fresh = fresh[[key not in known for key in _keys(fresh)]]
        if len(fresh):
            self.partition.mkdir(parents=True, exist_ok=True)
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%f")
            fresh.to_parquet(self.partition / f"part-{stamp}.parquet", index=False, compression="zstd")
        self.staging.unlink()
        write_card(self.root)
        return len(fresh)

    def device_frame(self) -> pd.DataFrame:
        """This device's rows (compacted ones only)."""
        parts = sorted(self.partition.glob("*.parquet"))
        return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True) if parts else pd.DataFrame()

    def counts(self) -> pd.Series:
        """Rows per workload on this device, compacted and staged."""
        frames = [f for f in (self.device_frame(), pd.DataFrame(read_jsonl_rows(self.staging)) if self.staging.exists()
                              else pd.DataFrame()) if len(f)]
        return pd.concat(frames)["workload"].value_counts() if frames else pd.Series(dtype=int)


def _keys(frame: pd.DataFrame) -> list[tuple[str, ...]]:
    """Each row's :data:`KEY`, as text (a Parquet round trip may change a column's type, not its text)."""
    return list(frame[list(KEY)].astype(str).itertuples(index=False, name=None))


def read_open_dataset(root: Path = OPEN_DATASET_DIR) -> pd.DataFrame:
    """Every device's rows, with the ``device`` partition column."""
    parts = sorted(root.glob(f"{PARTITION}=*/*.parquet"))
    return pd.read_parquet(root, engine="pyarrow") if parts else pd.DataFrame()


def device_facts(key: str, root: Path = OPEN_DATASET_DIR) -> HostFacts:
    """The host facts a predictor takes of device ``key``, as its rows in the dataset at ``root`` recorded them
    (OpBenchError naming the devices there when it has none)."""
    frame = read_open_dataset(root)
    devices = sorted(set(frame["device_key"])) if len(frame) else []
    if key not in devices:
        raise OpBenchError(f"device '{key}' has no rows in {root} (devices: {', '.join(devices) or 'none'})")
    return HostFacts.of_features(frame[frame["device_key"] == key].iloc[0].to_dict(), key)


def write_card(root: Path) -> Path:
    """``_CARD.md``: what the dataset holds per device, how it was measured and what bumps its version."""
    frame = read_open_dataset(root)
    lines = [f"# OpBench open dataset, version {VERSION}", "",
             "Measurements of operator schedules, one Hive partition per device key (`device=<key>`): the CPU's "
             "identity, its core count and a digest of its ISA and caches. Each row is one trial that ran and "
             "matched its reference: the workload, its template and config (JSON), the threads, the cache state "
             "(warm: the operator alone), the estimate over independent placements with its interval "
             "(`latency_lo_ms`, `latency_hi_ms`; docs/measurement.md), the `feat.*` columns a predictor takes, and "
             f"the record schema (now {SCHEMA_VERSION}), features version, TVM version, commit and date it was measured "
             "at. No hostnames, paths or error texts. The version is bumped when a column changes meaning or goes "
             "away; new columns do not bump it. `opbench dataset collect --minutes N` adds to this device's "
             "partition, never the same measurement twice.", "",
             "| device | rows | workloads | commits | measured |", "|---|---|---|---|---|"]
    if len(frame):
        for _, rows in frame.groupby(PARTITION, observed=True):
            lines.append(f"| {rows['device_key'].iloc[0]} | {len(rows)} | {rows['workload'].nunique()} | "
                         f"{', '.join(sorted(rows['commit'].unique()))} | {rows['measured_on'].min()} to "
                         f"{rows['measured_on'].max()} |")
    path = root / CARD
    root.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path

