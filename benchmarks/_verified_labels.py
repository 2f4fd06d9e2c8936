"""A collection's labels measured again: each ok record near its task's fastest, timed by a fresh measurer (other
processes, other buffers), labelled with the faster of its two measurements.

One trial's repeats share one process and one set of buffers, so a slowdown of that placement repeats with them:
a config's recorded latency can be twice its speed at a CV under 1%, and such a label decides a task's top-1.
Interference only slows a kernel, so the faster of two independent measurements is the better label. Records are
never changed: the verified latencies live beside them, by trial id, in ``VERIFIED``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from pathlib import Path

import pandas as pd

from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions, TrialSpec
from opbench.predictor.model import task_keys
from opbench.record import TrialRecord, config_of, is_ok
from opbench.tracking.jsonl import read_jsonl_records
from opbench.workloads import parse_workload

VERIFIED = "verified_latency.parquet"
NEAR = 2.0  # records within this factor of their task's fastest are measured again (the held-out tasks': all)


def near_best(records: list[TrialRecord], near: float, whole: Collection[str] = ()) -> list[TrialRecord]:
    """The ok records within ``near`` times their task's fastest recorded latency, and every one of the tasks
    ``whole`` (noisy ones too: measuring a label again is what they need, not leaving it out)."""
    frame = pd.DataFrame([r for r in records if is_ok(r)])
    keys = task_keys(frame)
    close = (frame["latency_ms"] <= near * frame["latency_ms"].groupby(keys).transform("min")) | keys.isin(whole)
    chosen = set(frame.loc[close, "trial_id"])
    return [r for r in records if r.get("trial_id") in chosen]


def verify(folder: Path, records_name: str, timing: TimingPolicy, make_parse: Callable[[Measurer], object],
           whole: Collection[str] = (), near: float = NEAR) -> None:
    """Measure again every ok record of ``folder/records_name`` within ``near`` times its task's fastest (of the
    tasks ``whole``: every one), workload by workload, saving each workload's latencies as it finishes (a killed
    verification resumes; a record that fails this time is saved as NaN, keeping its recorded label); ``make_parse``
    registers what the workloads need to parse (a model's fused operators)."""
    path = folder / VERIFIED
    done = pd.read_parquet(path) if path.exists() else pd.DataFrame({"trial_id": [], "verified_latency_ms": []})
    known = set(done["trial_id"])
    todo = [r for r in near_best(read_jsonl_records(folder / records_name), near, whole) if r["trial_id"] not in known]
    if not todo:
        return
    by_workload: dict[str, list[TrialRecord]] = {}
    for record in todo:
        by_workload.setdefault(record["workload"], []).append(record)
    started = time.monotonic()
    with Measurer(MeasureOptions(timing, build_workers=2)) as measurer:
        make_parse(measurer)
        for n, (name, mine) in enumerate(by_workload.items(), start=1):
            print(f"[{n}/{len(by_workload)}] {name}: {len(mine)} records measured again "
                  f"({time.monotonic() - started:.0f} s so far)", flush=True)
            workload = parse_workload(name)
            specs = [TrialSpec(workload, config_of(r), Resources(r["threads"]), r["template"]) for r in mine]
            again = measurer.measure_batch(specs)
            fresh = pd.DataFrame({"trial_id": [r["trial_id"] for r in mine],
                                  "verified_latency_ms": [a["latency_ms"] if is_ok(a) else math.nan for a in again]})
            done = pd.concat([done, fresh], ignore_index=True)
            done.to_parquet(path)
    print(f"verified {len(todo)} records in {time.monotonic() - started:.0f} s: {path}")


def verified(frame: pd.DataFrame, folder: Path) -> tuple[pd.DataFrame, str]:
    """``frame`` with each verified record labelled with the faster of its two latencies (``recorded_latency_ms``
    keeps the first), and a line saying how many labels were verified and moved."""
    path = folder / VERIFIED
    if not path.exists():
        return frame, f"labels as recorded (no {VERIFIED}: run --verify to measure them again)"
    again = pd.read_parquet(path).drop_duplicates("trial_id", keep="last").set_index("trial_id")["verified_latency_ms"]
    second = frame["trial_id"].map(again)
    labelled = frame.assign(recorded_latency_ms=frame["latency_ms"],
                            latency_ms=frame["latency_ms"].where(second.isna(), frame["latency_ms"].clip(upper=second)))
    moved = (labelled["latency_ms"] < 0.9 * labelled["recorded_latency_ms"]).sum()
    return labelled, (f"labels: {second.notna().sum()} records measured again ({VERIFIED}), each the faster of its two "
                      f"latencies; {moved} of them more than 10% faster than recorded")
