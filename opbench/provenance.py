"""Which code measured a number: the commit of the checkout OpBench runs from."""
from __future__ import annotations

import subprocess

from opbench.paths import PROJECT_ROOT

DATA = ("benchmarks/results", "datasets")  # what measurements write into the checkout: not code


def source_commit() -> str:
    """The checkout's commit, ``+changes`` when its tracked files but the measurements' (:data:`DATA`) differ from
    it ("unknown" outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":(exclude){d}" for d in DATA))
        return head + ("+changes" if changed.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
