"""The write-ahead log: every record reaches local disk (appended and fsynced) before MLflow gets it and
before any engine hears of it, so a process killed at any point loses no measured trial.

Each process keeps its own JSON-lines file per invocation of a study (one MLflow parent run):
``<store>/wal/<study>/<parent run id>/<host>-<pid>.jsonl``. Whoever next opens that parent run (a
resumed ``tune``, a restarted measurement service, ``opbench verify``) replays the files of this
host's dead processes: records MLflow lacks are written to it (see ``Recorder.replay``).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from opbench.lifecycle import process_alive
from opbench.record import TrialRecord
from opbench.tracking.jsonl import JsonlWriter, read_jsonl_records
from opbench.tracking.row import Row

REPLAY_LOCK = ".replay.lock"


class WriteAheadLog:
    """This process's log in ``directory`` (an invocation's folder)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._writer = JsonlWriter(directory / f"{socket.gethostname()}-{os.getpid()}.jsonl")

    def append(self, record: TrialRecord | Row) -> None:
        """On disk when this returns (fsync)."""
        self._writer.write(record)


def logged_by(directory: Path, pid: int) -> list[TrialRecord]:
    """What this host's process ``pid`` logged ahead in ``directory`` (nothing when it logged nothing)."""
    path = directory / f"{socket.gethostname()}-{pid}.jsonl"
    return read_jsonl_records(path) if path.exists() else []


def dead_processes_logs(directory: Path) -> dict[tuple[str, int], list[TrialRecord]]:
    """(host, pid) -> the records in the log of each of this host's processes that are gone (a live
    process writes its own)."""
    return {(host, int(pid)): read_jsonl_records(path) for path in sorted(directory.glob("*.jsonl"))
            if _is_dead(path.stem) for host, _, pid in [path.stem.rpartition("-")]}


def _is_dead(stem: str) -> bool:
    host, _, pid = stem.rpartition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's log (a shared folder): that host replays it
    return int(pid) != os.getpid() and not process_alive(int(pid))


@contextlib.contextmanager
def replaying(directory: Path) -> Iterator[None]:
    """Held while one process replays ``directory``: two restarting at once write each record once."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / REPLAY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
