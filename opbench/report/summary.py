"""``opbench report``: a study's records read back from MLflow as curves, a table and the best schedule."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from opbench.record import TrialRecord, best_ok, config_of, ok_records, pareto_front
from opbench.report.plots import best_so_far, engine_curves, tradeoff
from opbench.report.progress import changed_knobs, table
from opbench.report.study_records import references


@dataclass
class EngineSummary:
    engine: str
    trials: int
    ok: int
    best_ms: float
    best_gflops: float
    trials_to_10pct: int  # first trial whose best-so-far is within 10% of the engine's best
    wall_s: float
    vs_torch: str  # the best's speed-up over torch as its study verified it in fresh processes, or "not verified"


def split_records(records: list[TrialRecord]) -> tuple[dict[str, list[TrialRecord]], dict[str, TrialRecord]]:
    """Tuning trials per engine (in time order) and the study's references (:func:`references`)."""
    series: dict[str, list[TrialRecord]] = {}
    for record in sorted(records, key=lambda r: r.get("finished_at") or 0.0):
        if not record.get("reference"):
            series.setdefault(record.get("engine") or "unknown", []).append(record)
    return series, references(records)


def verified_text(claims: dict[str, float], name: str) -> str:
    """A verified speed-up over ``name`` with its range (``claims``: a parent run's ``verified_speedup_vs_*``), or
    "not verified"."""
    key = f"verified_speedup_vs_{name}"
    if key not in claims:
        return "not verified"
    return f"{claims[key]:.3g}x ({claims.get(key + '_min', math.nan):.3g}-{claims.get(key + '_max', math.nan):.3g})"


def summarize_engine(engine: str, records: list[TrialRecord], refs: dict[str, TrialRecord],
                     claims: dict[str, dict[str, float]] | None = None) -> EngineSummary:
    """An engine's trials summarised; its speed-up over torch only as verified for its best trial (``claims``: the
    verified speed-ups by the trial id each study verified as its best)."""
    curve = best_so_far(records)
    best = curve[-1] if curve else math.inf
    ok = ok_records(records)
    best_record = best_ok(ok)
    reach = next((i for i, b in enumerate(curve, start=1) if b <= 1.1 * best), 0) if best < math.inf else 0
    times = [r["finished_at"] for r in records if r.get("finished_at")]
    wall = (max(times) - min(times) + records[0].get("trial_s", 0.0)) if times else math.nan
    return EngineSummary(engine, len(records), len(ok), best if best < math.inf else math.nan,
                         best_record["gflops"] if best_record else math.nan, reach, wall,
                         verified_text((claims or {}).get(best_record.trial_id, {}) if best_record else {}, "torch"))


def summary_table(summaries: list[EngineSummary]) -> str:
    return table([(s.engine, s.trials, s.ok, s.best_ms, s.best_gflops, s.trials_to_10pct, s.wall_s, s.vs_torch)
                  for s in summaries],
                 ["engine", "trials", "ok", "best_ms", "GFLOP/s", "trials_to_10%", "wall_s", "x torch (verified)"])


def best_tir(record: TrialRecord) -> str:
    """The best trial's scheduled TensorIR (what ``tvm.compile`` lowers), rebuilt from its record."""
    from opbench.space import get_template
    from opbench.workloads import parse_workload

    workload = parse_workload(record["workload"])
    template = get_template(workload, record.get("template"))
    config = template.validate(config_of(record), workload)
    return template.schedule(workload, config).script()


def write_report(records: list[TrialRecord], title: str, out: Path, claims: dict[str, dict[str, float]] | None = None
                 ) -> tuple[list[EngineSummary], list[Path]]:
    """Plots and the best schedule's TIR under ``out``; the per-engine summaries (``claims``: see
    :func:`summarize_engine`)."""
    series, refs = split_records(records)
    if not series:
        from opbench.exceptions import OpBenchError

        raise OpBenchError(f"{title}: no tuning trials recorded")
    summaries = [summarize_engine(e, rs, refs, claims) for e, rs in series.items()]
    trials = [r for rs in series.values() for r in rs]
    paths = [engine_curves(series, refs, f"{title}: best so far vs trial", out / "curve_vs_trial.png"),
             engine_curves(series, refs, f"{title}: best so far vs wall time", out / "curve_vs_time.png", "time"),
             tradeoff(trials, pareto_front(trials, ("latency", "threads")), "threads", f"{title}: latency vs threads",
                      out / "latency_vs_threads.png")]
    best = best_ok(trials)
    if best:
        tir = out / "best_schedule.py"
        tir.write_text(f"# {best['workload']} best: {best['latency_ms']:.4f} ms, {best.get('engine')}, "
                       f"threads={best['threads']} {changed_knobs(best)}\n" + best_tir(best))
        paths.append(tir)
    return summaries, paths
