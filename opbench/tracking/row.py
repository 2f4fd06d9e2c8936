"""A record as a store holds it: one flat row (:meth:`opbench.record.TrialRecord.to_row`)."""
from __future__ import annotations

import json
import math
from typing import Any

Row = dict[str, Any]


def json_line(row: Row) -> str:
    """``row`` as one JSON line: unset columns, NaN and infinities left out."""
    kept = {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}
    return json.dumps(kept, allow_nan=False)
