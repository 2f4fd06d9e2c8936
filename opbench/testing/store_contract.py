"""The contract every record store keeps, shipped for authors of another sink (as
:mod:`opbench.testing.engine_contract` is for engines): the rows written come back with every column and
value, lists as lists and missing numbers as missing, whatever the store does with types underneath.

``write`` takes the rows of :func:`sample_rows` one at a time; ``read`` returns what the store holds, as
records or rows in any order. OpBench's own suite runs :func:`check_round_trip` over its JSON-lines log,
its write-ahead log and MLflow.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opbench.record import Status, TrialRecord
from opbench.tracking.row import Row


def sample_rows(study: str = "contract") -> list[Row]:
    """An ok trial with latencies, knobs and features; a rejected config whose knob values are odd; a
    failed run with a missing number; a library baseline with its processes' latencies."""
    ok = TrialRecord(workload="matmul-8", op="matmul", shape="8x8x8", dtype="float32", template="matmul", threads=2,
                     target="llvm -mcpu=x", host="h", latency_ms=1.25, latency_ms_mean=1.3, latency_cv=0.01, gflops=3.5,
                     number=7, repeat=3, latencies_ms=[1.2, 1.25, 1.45], study=study, engine="contract",
                     knobs={"i_split": "2x2x2", "vectorize": 1}, features={"flops": 1024.0, "ms000": 0.5})
    ok.set(engine_trial="0")
    rejected = TrialRecord(workload="matmul-8", op="matmul", template="matmul", status=Status.INVALID_CONFIG.value,
                           error="knob 'i_split': 'é,\"x\"' is not a choice", study=study, engine="contract",
                           knobs={"i_split": 'é,"x"', "order": "[1, 2]"})
    crashed = TrialRecord(workload="matmul-8", op="matmul", template="matmul", status=Status.RUN_ERROR.value,
                          error="run: killed by SIGSEGV", build_s=0.5, max_abs_err=math.nan, study=study, engine="contract")
    torch = TrialRecord(workload="matmul-8", op="matmul", template="torch", latency_ms=0.9, study=study, engine="contract",
                        latencies_ms=[0.9, 0.95, 1.1])
    torch.set(reference="torch")
    return [r.to_row() for r in (ok, rejected, crashed, torch)]


def check_round_trip(write: Callable[[Row], object], read: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
    """Every row of :func:`sample_rows` written comes back from ``read`` once, equal column by column
    (a NaN written may come back missing)."""
    written = sample_rows()
    for row in written:
        write(row)
    back = {r["trial_id"]: r for r in read()}
    assert set(back) == {r["trial_id"] for r in written}, "rows lost or added"
    for row in written:
        got = {k: v for k, v in back[row["trial_id"]].items() if not _missing(v)}
        want = {k: v for k, v in row.items() if not _missing(v)}
        assert got == want, f"{row['trial_id']}: {_diff(want, got)}"


def _missing(value: object) -> bool:
    return value is None or isinstance(value, float) and math.isnan(value)


def _diff(want: Mapping[str, Any], got: Mapping[str, Any]) -> dict[str, tuple[object, object]]:
    return {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
