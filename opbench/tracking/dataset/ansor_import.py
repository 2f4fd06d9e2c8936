"""Ansor (``auto_scheduler``) JSON-lines logs as records: the format TenSet's dataset stores, one measurement a line
(``i``: the task and the schedule's steps, ``r``: costs in seconds, error number, total time, timestamp).

A task whose workload key names a function (``["_matmul", 512, 1024, 64, "float32"]``) OpBench's catalogue also
has becomes that catalogue workload; any other task (TenSet's are named by the hash of a Relay function, whose
compute lived in ``auto_scheduler``'s registry, gone in TVM 0.27) keeps its raw key as its workload and task key,
with its latencies, so a predictor can still learn from it.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.record import Status, TrialRecord
from opbench.tracking.row import Row
from opbench.workloads import parse_workload

TEMPLATE = "ansor"
RAW_PREFIX = "ansor:"  # the workload of a task whose key names no catalogue operator
# Function-named tasks by the catalogue workload they compute. ``_matmul``'s arguments are (m, k, n, dtype): its
# logged schedules split a 512 loop, a 64 loop and reduce over 1024 for ["_matmul", 512, 1024, 64, "float32"].
FUNCTIONS: dict[str, Callable[..., str]] = {
    "_matmul": lambda m, k, n, dtype="float32": f"matmul:m={m},n={n},k={k},dtype={dtype}",
}


def catalogue_workload(key: list[Any]) -> str | None:
    """The catalogue workload an Ansor workload key names, or None where its function is not one OpBench has."""
    make = FUNCTIONS.get(str(key[0])) if key else None
    if make is None:
        return None
    try:
        return parse_workload(make(*key[1:])).name
    except (TypeError, OpBenchError):
        return None


def ansor_record(line: str, study: str) -> TrialRecord:
    """One log line as a record; its trial id is the line's hash, so importing it again adds nothing."""
    try:
        entry = json.loads(line)
        (key_text, target, hardware, *_), _state = entry["i"]
        costs, error_no, _all_cost, timestamp = entry["r"]
        key = json.loads(key_text)
    except (ValueError, KeyError, TypeError) as exc:
        raise OpBenchError(f"not an Ansor log line ({str(exc)[:100]}): {line[:120]}") from None
    workload = catalogue_workload(key)
    spec = parse_workload(workload) if workload else None
    ok = error_no == 0 and bool(costs)
    record = TrialRecord(
        workload=workload or f"{RAW_PREFIX}{key_text}", task_key=spec.task_key if spec else key_text,
        op=spec.op.name if spec else TEMPLATE, shape=spec.shape if spec else "", dtype=spec.dtype if spec else "",
        template=TEMPLATE, threads=int(hardware[0]) if hardware else 1, cores="", target=str(target), host="imported",
        status=(Status.OK if ok else Status.RUN_ERROR).value, error="" if ok else f"Ansor error number {error_no}",
        trial_id=hashlib.sha256(line.strip().encode()).hexdigest()[:16], finished_at=float(timestamp),
        study=study, engine="ansor-import")
    if ok:
        latencies_ms = [float(c) * 1e3 for c in costs]
        median = statistics.median(latencies_ms)
        record.set(latency_ms=median, latency_ms_mean=statistics.fmean(latencies_ms), latencies_ms=latencies_ms,
                   repeat=len(latencies_ms), gflops=spec.flops / (median * 1e-3) / 1e9 if spec else None)
    return record


def is_ansor_log(path: Path) -> bool:
    """Whether ``path`` is an Ansor JSON-lines log (its first line a record with ``i`` and ``r``)."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    try:
        return {"i", "r"} <= set(json.loads(first))
    except (ValueError, TypeError):
        return False


def ansor_rows(path: Path, study: str) -> Iterator[Row]:
    """The rows of every line of the log at ``path`` (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield ansor_record(line, study).to_row()
