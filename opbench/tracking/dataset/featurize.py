"""Features a dataset's older records lack, computed from what they recorded (``opbench dataset featurize``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from opbench.exceptions import WorkloadError
from opbench.measure.features import FEATURES_VERSION, NEST_FEATURES, record_nest_features
from opbench.record import FEATURE_PREFIX, Status

NEST_COLUMNS = tuple(f"{FEATURE_PREFIX}{name}" for name in NEST_FEATURES)
PROGRESS_EVERY = 5000  # records between two progress lines


@dataclass
class Featurized:
    """What :func:`add_nest_features` did: how many records got the features, and the workloads of those it
    left as they were because their workload no longer parses (a log of an older catalogue)."""

    added: int = 0
    unparsed: dict[str, str] = field(default_factory=dict)  # workload -> why it does not parse


def add_nest_features(frame: pd.DataFrame, progress: Callable[[int, int], None] = lambda done, total: None
                      ) -> tuple[pd.DataFrame, Featurized]:
    """``frame`` with the compute-nest features (features version 2) of every record made before records
    carried them, from its config and the CPU it ran on (:func:`~opbench.measure.features.record_nest_features`),
    its ``features_version`` brought up to date, and what was done. A record that carries them, an invalid
    config (never built), a record of no known version and one whose workload no longer parses keep what they
    have. ``progress(done, total)`` is told every :data:`PROGRESS_EVERY` records."""
    done = Featurized()
    if "features_version" not in frame:
        return frame, done
    older = frame.index[(frame["features_version"].astype(str) == "1") &
                        (frame.get("status", pd.Series("", index=frame.index)) != Status.INVALID_CONFIG.value)]
    rows, featurized = [], []
    for count, (index, record) in enumerate(frame.loc[older].iterrows(), 1):
        try:
            rows.append(record_nest_features(record.dropna().to_dict()))
            featurized.append(index)
        except WorkloadError as e:
            done.unparsed.setdefault(str(record["workload"]), str(e))
        if count % PROGRESS_EVERY == 0:
            progress(count, len(older))
    out = frame.copy()
    for column in NEST_COLUMNS:
        if column not in out:
            out[column] = float("nan")
    if rows:
        out.loc[featurized, list(NEST_COLUMNS)] = pd.DataFrame(rows, index=featurized, columns=list(NEST_COLUMNS))
        out.loc[featurized, "features_version"] = FEATURES_VERSION
    done.added = len(featurized)
    return out, done
