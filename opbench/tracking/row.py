"""A record as a store holds it: one flat row (:meth:`opbench.record.TrialRecord.to_row`)."""
from __future__ import annotations

import json
import math
from typing import Any

from opbench.record import FEATURE_PREFIX, KNOB_PREFIX, METRICS, PARAMS, TAGS

Row = dict[str, Any]


def json_line(row: Row) -> str:
    """``row`` as one JSON line: unset columns, NaN and infinities left out."""
    kept = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}
    return json.dumps(kept, allow_nan=False)


def column_order(columns: list[str]) -> list[str]:
    """Canonical column order of a dataset: fixed columns, then knobs, then features."""
    fixed = [c for c in (*PARAMS, *METRICS, *TAGS) if c in columns]
    rest = sorted(c for c in columns if c not in fixed)
    knobs = [c for c in rest if c.startswith(KNOB_PREFIX)]
    feats = [c for c in rest if c.startswith(FEATURE_PREFIX)]
    other = [c for c in rest if c not in knobs and c not in feats]
    return fixed + other + knobs + feats
