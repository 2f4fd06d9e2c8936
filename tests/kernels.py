"""Helpers for tests that build and check many kernels."""
from __future__ import annotations

from typing import Any


def failures(records: list[dict[str, Any]], knobs: str = "knob.") -> list[tuple[str, str, dict[str, Any]]]:
    """Each record that is not ok: its workload, error and the knobs whose names start with ``knobs``."""
    return [(r["workload"], r["error"], {k: v for k, v in r.items() if k.startswith(knobs)})
            for r in records if r["status"] != "ok"]
