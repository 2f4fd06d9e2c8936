"""How long a user waits for a quick look: ``opbench tune W --trials 3`` (references and verification on), run as
the command, each time a new study in a new MLflow store, in one run.

The first run measures the library baselines (as the first study of the hour does); the later ones reuse them
(``OPBENCH_BASELINE_REUSE_S``'s default). Each line the command prints is timed as it arrives, and a run's wall
time is split at the lines that end each phase: set-up (MLflow store and parent run, the workers starting beside
them) until ``tuning ...``, the references until the last ``[reference ...]``, the trials until the last
``[k/N]``, the verification (the best chosen among the contenders, then the rounds) and the summary (plots, the
parent run's metrics) until the verification's table, and the rest until the process ended. The fresh processes
of the verification (from the study's records) tell a run that chose its best among contenders from one that
did not. Target (issue 38): <= 45 s on the 2-core host.

    .venv/bin/python benchmarks/quick_study.py [--workload matmul-512] [--runs 3]   (results: benchmarks/results/)
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import Results

from opbench.report.progress import table
from opbench.studies.verify import CONTENDER, VERIFY_KIND
from opbench.tracking.mlflow_read import read_mlflow_records

TARGET_S = 45.0
PHASES = ("set-up", "references", "trials", "verification+plots", "exit")
# The lines that end each phase but the last (the last such line, where there are several)
ENDS = (re.compile(r"tuning \S+ with "), re.compile(r"\[reference "), re.compile(r"\[\d+/\d+\] "), re.compile(r"schedule "))


def timed_lines(argv: list[str], env: dict[str, str]) -> tuple[list[tuple[float, str]], float, int]:
    """The command's output lines (stdout and stderr together) with when each arrived, its wall time and exit code."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in proc.stdout]
    code = proc.wait()
    return lines, time.perf_counter() - start, code


def phases(lines: list[tuple[float, str]], wall_s: float) -> list[float]:
    """Seconds of each of :data:`PHASES`: each from the line that ended the one before (the start, for set-up)
    to the last line that ends it (the process's end, for the summary)."""
    marks = [max((t for t, line in lines if end.match(line)), default=math.nan) for end in ENDS]
    return [b - a for a, b in zip([0.0, *marks], [*marks, wall_s])]


def fresh_processes(study: str, tracking_uri: str) -> tuple[int, int]:
    """How many fresh processes the study's verification started (one per placement): choosing the best, and
    re-measuring it and the references."""
    records = read_mlflow_records([study], tracking_uri, kind=VERIFY_KIND)
    choosing = [r for r in records if str(r.get("verified_as", "")).startswith(CONTENDER)]
    return sum(r.get("placements", 1) for r in choosing), sum(r.get("placements", 1) for r in records if r not in choosing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="matmul-512")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = Results("quick_study")
    command = [str(Path(sys.executable).parent / "opbench"), "tune", args.workload, "--trials", "3"]
    rows, walls = [], []
    for run in range(1, args.runs + 1):
        env = dict(os.environ)
        if run > 1:
            env.pop("OPBENCH_BASELINE_REUSE_S", None)  # the default: a baseline of this hour is reused
        with tempfile.TemporaryDirectory(prefix="opbench-quick-") as scratch:
            uri = f"sqlite:///{scratch}/mlflow.db"
            argv = [*command, "--study", f"quick-{run}", "--tracking-uri", uri]
            print(f"run {run}: {' '.join(argv)}", flush=True)
            lines, wall_s, code = timed_lines(argv, env)
            if code != 0:
                raise SystemExit("\n".join(line for _, line in lines[-20:]) + f"\nrun {run} exited {code}")
            choosing, verifying = fresh_processes(f"quick-{run}", uri)
        walls.append(wall_s)
        rows.append([run, "measured" if run == 1 else "reused", f"{wall_s:.1f}", *(f"{s:.1f}" for s in phases(lines, wall_s)),
                     f"{choosing} / {verifying}", "met" if wall_s <= TARGET_S else "NOT MET"])
    results.table(table(rows, ["run", "baselines", "wall s", *(f"{p} s" for p in PHASES), "fresh processes (choosing / rounds)",
                               f"<= {TARGET_S:.0f} s"]))
    met = sum(w <= TARGET_S for w in walls)
    results.print(f"median {statistics.median(walls):.1f} s, {min(walls):.1f}-{max(walls):.1f}; "
                  f"{met} of {len(walls)} runs within {TARGET_S:.0f} s")
    results.save()


if __name__ == "__main__":
    main()
