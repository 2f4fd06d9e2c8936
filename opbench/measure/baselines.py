"""Library baselines remembered on this host for a while, so a quick study does not time torch and numpy
in fresh processes again (docs/measurement.md#baselines).

A baseline is reused only when it was measured on this device (its key) for the same workload, library version,
threads and cores within ``max_age_s``, and the caller has just found the host in its usual state; the
reused record is a copy with a new trial id that names the original in ``reused_from``.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from opbench.hardware.resources import Resources
from opbench.paths import read_json_map, user_runtime_dir, write_private
from opbench.record import TrialRecord, is_ok, new_trial_id
from opbench.workloads import Workload

BASELINES_FILE = "baselines.json"


def baseline_key(workload: Workload, library: str, resources: Resources, device: str) -> str:
    """What a baseline depends on: the device (its key), library and its version, workload, threads, cores and
    target."""
    try:
        version = metadata.version(library)
    except metadata.PackageNotFoundError:
        version = "?"
    return f"{device}|{library}=={version}|{workload.spec}|{resources.threads}|{resources.cores_label}|{resources.target}"


class BaselineCache:
    """This user's remembered baselines, in a private JSON file (the last writer's view wins)."""

    def __init__(self, path: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.path = path or user_runtime_dir() / BASELINES_FILE
        self._clock = clock

    def get(self, key: str, max_age_s: float) -> TrialRecord | None:
        """A copy of the baseline stored under ``key`` if it is at most ``max_age_s`` old, marked reused."""
        entry = read_json_map(self.path).get(key)
        if entry is None or not 0 <= self._clock() - entry["measured_at"] <= max_age_s:
            return None
        record = TrialRecord.from_row(entry["record"])
        return record.replace(reused_from=record.trial_id, trial_id=new_trial_id(),
                              baseline_age_s=self._clock() - entry["measured_at"], finished_at=self._clock())

    def put(self, key: str, record: TrialRecord) -> None:
        """Remember an ok baseline record (a failed one is never reused)."""
        if not is_ok(record) or record.get("reused_from"):
            return
        entries = read_json_map(self.path)
        entries[key] = {"measured_at": self._clock(), "record": record.to_row()}
        write_private(self.path, json.dumps(entries, default=str).encode())

