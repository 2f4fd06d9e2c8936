"""A study's speed-ups as a table: verified ones with their range, or "not verified"."""
from __future__ import annotations

import math

from opbench.record import TrialRecord, is_ok
from opbench.report.progress import table
from opbench.studies.verify import BEST, Spread, Verification

HEADERS = ["schedule", "tuned ms", "verified ms", "min-max", "best is x faster (tuned)",
           "verified x faster (min-max)", "claim"]


def spread_text(spread: Spread | None, digits: int = 4) -> str:
    """``median (min-max)``, or "not verified" when nothing was measured."""
    if spread is None or math.isnan(spread.median):
        return "not verified"
    return f"{spread.median:.{digits}g} ({spread.lo:.{digits}g}-{spread.hi:.{digits}g})"


def _range(spread: Spread | None, digits: int = 4) -> str:
    return "-" if spread is None else f"{spread.lo:.{digits}g}-{spread.hi:.{digits}g}"


def speedup_table(best: TrialRecord | None, references: dict[str, TrialRecord], verification: Verification | None,
                  best_label: str = BEST) -> str:
    """The study's speed-ups as a table: verified ones with their range, or "not verified"."""
    tuned = {BEST: best, **references} if best else dict(references)
    rows = []
    for name, record in tuned.items():
        tuned_ms = record.get("latency_ms", math.nan) if is_ok(record) else math.nan
        ratio = tuned_ms / best["latency_ms"] if best and name != BEST else math.nan
        schedule = verification.schedules.get(name) if verification else None
        lat = schedule.latency if schedule else None
        if name == BEST:
            verified, claim = ("1.0" if lat else "not verified"), ""
        elif verification is None or lat is None or verification.best.latency is None:
            verified, claim = "not verified", ""
        else:
            up = verification.speedup(name)
            verified = "not verified" if up is None else f"{up.median:.3g} ({_range(up, 3)})"
            holds = verification.holds(name)
            claim = "" if holds is None else "holds" if holds else "DOES NOT HOLD"
        rows.append((best_label if name == BEST else name, tuned_ms, lat.median if lat else "not verified",
                     _range(lat), ratio, verified, claim))
    return table(rows, HEADERS)
