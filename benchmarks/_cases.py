"""The cases of a long benchmark kept as each one finishes, so that a run that stops resumes where it did and
its table can be assembled over several days: ``benchmarks/results/<benchmark>/<device>.jsonl``, one JSON object
a case, with the commit, date and device it was measured at and the settings it was measured with. A case is
done for a run whose settings are the same; other settings measure it again (the old line stays)."""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from _results import RESULTS

from opbench.hardware.resources import host_facts
from opbench.paths import safe_name
from opbench.provenance import source_commit


class CaseStore:
    """Finished cases of ``benchmark`` on this device, measured with ``settings``."""

    def __init__(self, benchmark: str, settings: dict[str, Any], folder: Path = RESULTS) -> None:
        self.device = host_facts().device_key
        self.settings = settings
        self.path = folder / benchmark / f"{safe_name(self.device)}.jsonl"

    def done(self) -> dict[str, dict[str, Any]]:
        """Each finished case by name (its latest line with these settings)."""
        if not self.path.exists():
            return {}
        lines = (json.loads(line) for line in self.path.read_text().splitlines() if line.strip())
        return {case["case"]: case for case in lines if case.get("settings") == self.settings}

    def add(self, case: str, result: dict[str, Any]) -> dict[str, Any]:
        """Append ``case``'s ``result`` (JSON-ready) with where and when it was measured; the line appended."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {"case": case, "commit": source_commit(), "date": f"{datetime.date.today():%Y-%m-%d}", "device": self.device,
                "settings": self.settings, **result}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")
        return line
