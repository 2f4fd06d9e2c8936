"""Where a benchmark's results go: printed as measured, and kept in ``benchmarks/results/<date>-<host>.md``
(a section per run, headed by the benchmark and when it finished; the CPU in the header).
Importing it also turns off the reuse of library baselines: every number a benchmark reports is its own."""
from __future__ import annotations

import datetime
import os
import re
import shlex
import sys
from pathlib import Path

from opbench.hardware.resources import host_facts
from opbench.paths import safe_name
from opbench.provenance import source_commit

RESULTS = Path(__file__).resolve().parent / "results"
os.environ["OPBENCH_BASELINE_REUSE_S"] = "0"  # a benchmark reports what it measured in its own run, nothing reused


class Results:
    """What one benchmark run prints, also written to this host's results file for today by :meth:`save`."""

    def __init__(self, benchmark: str, device: str = "") -> None:
        self.benchmark = benchmark
        self.device = device  # an accelerator the results are of: its own file beside the host's
        self._lines = [f"`{shlex.join(['python', *sys.argv])}` at commit {source_commit()}", ""]

    def print(self, text: str = "") -> None:
        print(text, flush=True)
        self._lines.append(text)

    def table(self, text: str) -> None:
        """A table from :func:`opbench.report.progress.table`, kept preformatted."""
        print(text, flush=True)
        self._lines += ["```", text, "```"]

    def save(self, folder: Path = RESULTS) -> Path:
        """Write (or replace) this benchmark's section in ``<folder>/<date>-<host>[-<device>].md``; where that
        file holds another machine's results (hosts of one name), in ``...-<CPU model>.md``: a file never mixes
        machines under one header."""
        facts = host_facts()
        folder.mkdir(parents=True, exist_ok=True)
        header = (f"# Benchmarks on {facts.hostname}, {datetime.date.today():%Y-%m-%d}\n\n"
                  f"{facts.cpu_model}, {facts.cores} cores, L2 {facts.l2_kb:.0f} KB, L3 {facts.l3_kb:.0f} KB, "
                  f"{facts.mem_gb:.0f} GB; TVM {facts.tvm_version}. Written by the benchmarks, as measured.\n")
        name = "-".join(filter(None, (f"{datetime.date.today():%Y-%m-%d}", facts.hostname, self.device)))
        path = folder / f"{safe_name(name)}.md"
        if path.exists() and not path.read_text().startswith(header):
            path = folder / f"{safe_name(f'{name}-{facts.cpu_model}')}.md"
        sections = _sections(path.read_text()) if path.exists() else {}
        sections[f"{self.benchmark}, finished {datetime.datetime.now():%H:%M}"] = "\n".join(self._lines).rstrip() + "\n"
        body = "\n".join(f"## {name}\n\n{text}" for name, text in sorted(sections.items()))
        path.write_text(f"{header}\n{body}")
        print(f"results: {path}")
        return path


def _sections(text: str) -> dict[str, str]:
    """The file's sections by heading: benchmark and when it finished (the header dropped)."""
    parts = re.split(r"^## (.+)\n\n", text, flags=re.M)
    return {name: body.rstrip() + "\n" for name, body in zip(parts[1::2], parts[2::2])}  # one blank line between
