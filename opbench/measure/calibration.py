"""Intervals calibrated by fresh-process re-measures (docs/measurement.md#calibration).

A trial's placements are taken in one process, minutes apart at most; a re-measure in another process, later,
meets the host in another state. So every re-measure OpBench makes anyway of a schedule no measurement chose (a
study's references, verified in fresh processes) is kept as the ratio of the fresh estimate to what the record said,
per device, the latest :data:`WINDOW` of them. Once a device has :data:`MIN_OBSERVED`, a record's interval spans at
least the middle :data:`COVERAGE` of those ratios around its estimate: where the host's state is stationary, a
re-measure lands in it that often by construction.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opbench.paths import open_nofollow, read_json_map, user_runtime_dir, write_private

CALIBRATION_FILE = "calibration-4.json"  # 4: references' fresh estimates against their records' (3: each fresh
# placement, the best's and contenders' too; 2: of the fast mode's median; 1-3 calibrate nothing)
WINDOW = 256  # ratios kept per device, the latest
MIN_OBSERVED = 20  # fewer calibrate nothing: the interval is the placements' alone
COVERAGE = 0.9  # the share of re-measures a calibrated interval holds


@dataclass(frozen=True)
class Bounds:
    """What a re-measure on a device is, as a ratio of the record's estimate, ``COVERAGE`` of the time."""

    low: float
    high: float
    observed: int


def widened(lo: float, hi: float, estimate: float, calibrated: Bounds | None) -> tuple[float, float]:
    """The interval ``(lo, hi)`` around ``estimate``, spanning at least ``calibrated``'s re-measures."""
    if calibrated is None:
        return lo, hi
    return min(lo, estimate * calibrated.low), max(hi, estimate * calibrated.high)


class Calibration:
    """Re-measure ratios by device key, in a private file of this user's."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or user_runtime_dir() / CALIBRATION_FILE
        self._read: tuple[float, dict[str, list[float]]] | None = None  # the file as last read, by its mtime

    def observe(self, device: str, recorded_ms: float, fresh_ms: Iterable[float]) -> None:
        """Keep each fresh-process estimate of a config whose record said ``recorded_ms``."""
        ratios = [v / recorded_ms for v in fresh_ms if v > 0 and math.isfinite(v)]
        if not ratios or not recorded_ms > 0:
            return
        with os.fdopen(open_nofollow(self.path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two verifications at once each keep their ratios
            kept = read_json_map(self.path)
            kept[device] = [*kept.get(device, []), *ratios][-WINDOW:]
            write_private(self.path, json.dumps(kept).encode())

    def bounds(self, device: str) -> Bounds | None:
        """The device's ratios' middle :data:`COVERAGE` (None: fewer than :data:`MIN_OBSERVED` known)."""
        ratios = self.ratios(device)
        if len(ratios) < MIN_OBSERVED:
            return None
        tail = (1 - COVERAGE) / 2
        low, high = np.quantile(ratios, [tail, 1 - tail])
        return Bounds(float(low), float(high), len(ratios))

    def ratios(self, device: str) -> list[float]:
        """The device's kept ratios of a re-measure to its record, oldest first."""
        return self._ratios().get(device, [])

    def _ratios(self) -> dict[str, list[float]]:
        """The file's ratios, read again only when it changed (a record asks for every trial)."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return {}
        if self._read is None or self._read[0] != mtime:
            self._read = (mtime, {k: v for k, v in read_json_map(self.path).items() if isinstance(v, list)})
        return self._read[1]
