"""Human-readable output: one line per trial, and tables."""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from opbench.record import TrialRecord, config_of, is_ok


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return "-" if value is None else str(value)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def changed_knobs(record: TrialRecord, base: dict[str, Any] | None = None) -> str:
    """The knob values of a record (only those differing from ``base`` when given)."""
    knobs = config_of(record)
    if base is not None:
        knobs = {k: v for k, v in knobs.items() if base.get(k) != v}
    return " ".join(f"{k}={v}" for k, v in knobs.items())


def interval(record: Mapping[str, Any]) -> str:
    """A record's interval as ``±H% of P``: its half-width and placements (empty without one)."""
    lo, hi, latency = record.get("latency_lo_ms"), record.get("latency_hi_ms"), record.get("latency_ms")
    if lo is None or hi is None or not latency:
        return ""
    return f"±{100 * (hi - lo) / 2 / latency:.1f}% of {record.get('placements', 1)}"


SAID_WAIT_S = 10.0  # placements that waited longer than this in all for the host to settle are said at a run's end


class TrialPrinter:
    """Prints ``[i/n] status latency interval GFLOP/s (best so far) knobs`` as each trial's record arrives, and
    ``[reference NAME]`` for a reference (neither counted nor a best). The best is its workload's: a run
    that tunes several operators (a model's) never shows one operator's time as another's best."""

    def __init__(self, total: int | None, stream: TextIO | None = None, base: dict[str, Any] | None = None) -> None:
        self.total, self._stream, self.base = total, stream, base
        self.count = 0
        self.best: dict[str, float] = {}  # per workload
        self.waited_s = 0.0  # the printed records' placements probing the host and waiting for it to settle

    def __call__(self, record: TrialRecord) -> None:
        latency, workload = record.get("latency_ms"), record.get("workload", "")
        self.waited_s += record.get("host_wait_s") or 0.0
        if record.get("reference"):
            head = f"[reference {record['reference']}]"
        else:
            self.count += 1
            if latency is not None and is_ok(record):
                self.best[workload] = min(self.best.get(workload, math.inf), latency)
            head = f"[{self.count}/{self.total}]" if self.total else f"[{self.count}]"
        result = (f"{latency:9.4f} ms {interval(record):>14s} {record.get('gflops', 0):7.1f} GFLOP/s"
                  if latency is not None else f"{'':42s}")
        best = f"best {self.best[workload]:.4f} ms" if workload in self.best else "best -"
        detail = changed_knobs(record, self.base)
        error = f"  [{record['error'].splitlines()[0][:120]}]" if record.get("error") else ""
        print(f"{head} {record['status']:<14s} {result}  {best:<16s} threads={record.get('threads')} "
              f"{detail}{error}", file=self._stream or sys.stderr, flush=True)  # sys.stderr as it is now

    def host_wait_line(self) -> str | None:
        """How long the printed records' placements waited for the host to settle, probing it included, where that
        is long enough to explain a slow run (over :data:`SAID_WAIT_S`); None otherwise."""
        if self.waited_s <= SAID_WAIT_S:
            return None
        return (f"placements waited {self.waited_s:.0f} s in all for the host to settle (host_wait_s of each record; "
                f"a trial of one placement takes the host as it finds it: docs/measurement.md#probes)")


def corun_line(record: TrialRecord) -> str:
    """One line for a co-run's own record: mode, layout, members, makespan and slowdown (or the error)."""
    head = f"co-run {record['corun_mode']} {record['cores']}: {record['workload']}: {record['status']}"
    if not is_ok(record):
        return f"{head} ({record['error'][:200]})"
    slowdown = f" (x{record['slowdown']:.2f} solo)" if "slowdown" in record else ""
    return f"{head}, makespan {record['makespan_ms']:.4f} ms{slowdown}, {record['gflops_total']:.1f} GFLOP/s"


def corun_printer(total: int | None) -> Callable[[TrialRecord], None]:
    """A line per co-run and per solo trial (the members of a co-run are summed up in its line)."""
    printer = TrialPrinter(total)

    def show(record: TrialRecord) -> None:
        if record.get("record_kind") == "corun":
            print(corun_line(record), flush=True)
        elif not record.get("corun_id"):
            printer(record)
    return show
