"""Optuna's journal file, appended to under ``flock`` and without ``fsync``.

Optuna's ``JournalFileBackend`` locks with a lock file that a killed holder leaves behind for 30 s
(its grace period) and fsyncs every append: one per parameter of an ask, ~20 ms a trial here. A
``flock`` goes with its holder, and a write the kernel has taken survives its process being killed
(as sqlite's ``synchronous=NORMAL`` does); only a power cut can lose the last appends.
"""
from __future__ import annotations

import fcntl
import json
from typing import Any

from optuna.storages.journal import JournalFileBackend


class JournalFile(JournalFileBackend):
    """Reads as Optuna's backend does; appends whole batches of logs under an exclusive ``flock``."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._path = path

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        with open(self._path, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or when its holder dies
            f.write(lines)  # one write of whole lines: readers never see two appends interleaved
