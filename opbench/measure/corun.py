"""Co-run trials: operators timed together, each under the others' interference.

``full``: every member runs in its own worker process, on its own core set (or sharing cores). Once
every member has loaded and checked its kernel, all are released at one barrier (a shared
``time.monotonic`` instant: the same clock in every process) and run back to back until one common
stop time, so they overlap for the whole window. ``stream``: the members run back to back in one
process on the same cores, as consecutive operators of a model do.

Each member is first timed alone with the same harness, resources and window (its solo latency),
so ``slowdown`` = co-run latency / solo latency compares like with like. The whole co-run holds the
host's timing lock: nothing else is timed while it runs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opbench.exceptions import OpBenchError
from opbench.measure.protocol import BuildResult, CoRunResult
from opbench.measure.series import latency_stats
from opbench.record import Status, TrialRecord, new_trial_id

if TYPE_CHECKING:
    from opbench.measure.types import TrialSpec

MODES = ("stream", "full")


@dataclass(frozen=True)
class CoRunSpec:
    """Trials run together in ``mode`` for ``window_s`` seconds (a single member is a solo run)."""

    members: tuple[TrialSpec, ...]
    mode: str = "full"
    window_s: float = 1.0
    solo: bool = True  # also time each member alone (for slowdowns); tuning that needs only the co-run skips it

    def validate(self) -> None:
        if self.mode not in MODES:
            raise OpBenchError(f"unknown co-run mode '{self.mode}'; modes: {', '.join(MODES)}")
        if not self.members:
            raise OpBenchError("a co-run needs workloads")
        if not self.window_s > 0:
            raise OpBenchError(f"the co-run window must be > 0 s, got {self.window_s}")
        if any(m.resources.target != "llvm" for m in self.members):
            raise OpBenchError("co-runs run on the local CPU (target llvm) only")
        if self.mode == "stream" and len({(m.resources.threads, m.resources.cores) for m in self.members}) > 1:
            raise OpBenchError("a stream co-run runs its members back to back in one process: "
                               "give them all the same threads and cores")


def _median_ms(latencies_s: list[float]) -> float:
    return statistics.median(latencies_s) * 1e3


def corun_records(spec: CoRunSpec, members: list[TrialRecord], solo: list[CoRunResult] | None,
                  together: list[CoRunResult] | None, failed: tuple[TrialSpec, BuildResult] | None) -> list[TrialRecord]:
    """The co-run's own record (``record_kind`` corun) followed by its members' records, all joined by
    ``corun_id``. ``members`` are the members' trial records, completed here with co-run latencies."""
    corun_id = new_trial_id()
    names = [m.workload for m in members]
    for i, record in enumerate(members):
        record.set(corun_id=corun_id, corun_mode=spec.mode, corun_with="+".join(names[:i] + names[i + 1:]))
    parent = TrialRecord(
        record_kind="corun", trial_id=corun_id, corun_mode=spec.mode, workload="+".join(names),
        op="+".join(m.op for m in members), threads=max(m.threads for m in members),
        cores=";".join(m.cores for m in members), target=members[0].target, host=members[0].host,
        tvm_version=members[0].tvm_version, window_s=spec.window_s)
    error = _first_error(solo, together, failed)
    if error:
        status, text = error
        for record, member in zip(members, spec.members):
            own = failed[1] if failed is not None and failed[0] is member else None
            record.set(status=(own.status if own else status).value, error=(own.error if own else text)[:4000])
        parent.set(status=status.value, error=text[:4000])
        return [_finish(parent, members)] + members
    assert together is not None  # no error: every member ran together
    # per member: (latencies, calls per sample, max |err| of its check), from its own worker or the shared one
    timed = [(r.latencies_s[0], r.numbers[0], r.max_abs_err[0]) for r in together] if spec.mode == "full" \
        else list(zip(together[0].latencies_s, together[0].numbers, together[0].max_abs_err))
    flops = [m.workload.flops for m in spec.members]
    for record, (member_lat, n, err), f in zip(members, timed, flops):
        stats = latency_stats([member_lat])
        record.set(**stats, status=Status.OK.value, error="", gflops=f / (stats["latency_ms"] * 1e-3) / 1e9, number=n,
                   repeat=len(member_lat), max_abs_err=err)
    co_ms = [r["latency_ms"] for r in members]
    if spec.mode == "stream":
        makespan = _median_ms(together[0].rounds_s)
        gflops_total = sum(flops) / (makespan * 1e-3) / 1e9
    else:
        makespan = max(co_ms)
        gflops_total = sum(f / (ms * 1e-3) / 1e9 for f, ms in zip(flops, co_ms))
    parent.set(status=Status.OK.value, error="", makespan_ms=makespan, gflops_total=gflops_total,
                  started_late_ms=max(r.started_late_s for r in together) * 1e3)
    if solo is not None:
        solo_ms = [_median_ms(s.latencies_s[0]) for s in solo]
        for record, ms in zip(members, solo_ms):
            record.set(solo_latency_ms=ms, slowdown=record["latency_ms"] / ms)
        solo_makespan = sum(solo_ms) if spec.mode == "stream" else max(solo_ms)
        parent.set(solo_makespan_ms=solo_makespan, slowdown=makespan / solo_makespan)
    return [_finish(parent, members)] + members


def _first_error(solo: list[CoRunResult] | None, together: list[CoRunResult] | None,
                 failed: tuple[TrialSpec, BuildResult] | None) -> tuple[Status, str] | None:
    if failed is not None:
        return failed[1].status, f"not co-run: {failed[0].workload.name} failed ({failed[1].status.value})"
    for phase, results in (("alone", solo or []), ("together", together or [])):
        for result in results:
            if result.status is not Status.OK:
                return result.status, f"{phase}: {result.error}"
    return None


def _finish(parent: TrialRecord, members: list[TrialRecord]) -> TrialRecord:
    parent.set(finished_at=time.time(),
               trial_s=max(m["trial_s"] for m in members))  # each member's clock started with the co-run
    return parent
