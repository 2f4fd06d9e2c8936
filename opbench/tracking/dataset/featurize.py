"""Features a dataset's older records lack, computed from what they recorded (``opbench dataset featurize``)."""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from opbench.measure.features import FEATURES_VERSION, NEST_FEATURES, record_nest_features
from opbench.record import FEATURE_PREFIX, Status

NEST_COLUMNS = tuple(f"{FEATURE_PREFIX}{name}" for name in NEST_FEATURES)
PROGRESS_EVERY = 5000  # records between two progress lines


def add_nest_features(frame: pd.DataFrame, progress: Callable[[int, int], None] = lambda done, total: None) -> tuple[pd.DataFrame, int]:
    """``frame`` with the compute-nest features (features version 2) of every record made before records
    carried them, from its config and the CPU it ran on (:func:`~opbench.measure.features.record_nest_features`),
    its ``features_version`` brought up to date; and how many records got them. A record that carries them,
    an invalid config (never built) and a record of no known version keep what they have. ``progress(done,
    total)`` is told every :data:`PROGRESS_EVERY` records."""
    if "features_version" not in frame:
        return frame, 0
    older = frame.index[(frame["features_version"].astype(str) == "1") &
                        (frame.get("status", pd.Series("", index=frame.index)) != Status.INVALID_CONFIG.value)]
    rows = []
    for done, (_, record) in enumerate(frame.loc[older].iterrows(), 1):
        rows.append(record_nest_features(record.dropna().to_dict()))
        if done % PROGRESS_EVERY == 0:
            progress(done, len(older))
    out = frame.copy()
    for column in NEST_COLUMNS:
        if column not in out:
            out[column] = float("nan")
    if rows:
        out.loc[older, list(NEST_COLUMNS)] = pd.DataFrame(rows, index=older, columns=list(NEST_COLUMNS))
        out.loc[older, "features_version"] = FEATURES_VERSION
    return out, len(older)
