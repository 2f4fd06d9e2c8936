"""Run the ``opbench`` command in the test process, as a user's shell would run it, capturing its output.

In-process saves what a new interpreter costs each call (Python, MLflow, Optuna, pandas: ~5 s of CPU
here); the command still starts its own worker processes (model studies too: they time nothing in their
own process). Tests that kill the command start it with ``subprocess`` instead.
"""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass

from opbench.cli import main

# How a command whose test checks what a study does, not how it times, times each run: one placement (the
# placements themselves are tested in test_host_speed.py and test_measure.py).
ONE_PLACEMENT = ["--placements", "1", "--max-placements", "1"]


@dataclass
class Result:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would return."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, check: bool = False) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else 2
    result = Result(code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"opbench {' '.join(map(str, args))} exited {code}:\n{result.stderr[-3000:]}")
    return result


def run_cli_process(*args: str) -> Result:
    """The command in a process of its own: for MetaSchedule, whose ``logging.config.dictConfig`` of the
    whole process breaks on its second run inside pytest (a handler without a name)."""
    out = subprocess.run([sys.executable, "-m", "opbench.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        raise AssertionError(f"opbench {' '.join(map(str, args))} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return Result(out.returncode, out.stdout, out.stderr)
