"""How far OpBench's timings can be trusted, measured in one run.

1. Repeatability: the same configs of matmul-512 and resnet50-c2 (valid, drawn at random) measured by
   two measurers whose workers are separate processes: Spearman rank correlation and median |delta| %.
2. Noise: the distribution of the coefficient of variation of every record's repeats.
3. Best configs: the three fastest configs per workload in run A re-measured in fresh processes (at least 5
   placements each, interleaved: the host's slow spells last seconds): their estimate against run B's
   measurement, a trial's record that did not choose them (against run A too, which did, and so counts its
   lucky draws: the winner's curse).
4. The torch reference of 5 short tuning studies (its placements each a fresh process, taken before the
   study's kernels) against torch timed the same way after them: each side's interval shows the host's own
   process-to-process noise.

Targets (issue 13): median CV <= 2%, best configs within 5% in fresh processes, Spearman >= 0.9,
torch references within 10%. Plot: run A vs run B latencies.

    .venv/bin/python benchmarks/measurement_quality.py [--configs 50] [--threads 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _results import Results
from scipy.stats import spearmanr

from opbench.engines.loop import run_tuning, template_check, valid_proposals
from opbench.engines.optuna.engine import OptunaEngine
from opbench.engines.simple import RandomEngine
from opbench.hardware.host_speed import Slowness
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.types import MeasureOptions, TrialSpec
from opbench.record import is_ok
from opbench.report.plots import predicted_vs_measured
from opbench.report.progress import table
from opbench.space import get_template
from opbench.studies.references import measure_references
from opbench.workloads import parse_workload

WORKLOADS = ("matmul-512", "resnet50-c2")
BEST_ROUNDS = 5  # fresh-process placements of each best config


def sample_configs(name: str, count: int, threads: int, seed: int) -> list[dict]:
    workload = parse_workload(name)
    template = get_template(workload)
    engine = RandomEngine(template.search_space(workload), threads, seed)
    return [p.config for p in valid_proposals(engine, template_check(workload, template), count, max_rejects=1000)]


def measure_all(name: str, configs: list[dict], resources: Resources) -> list[dict]:
    """One measurer (its own build and run processes) times every config, in order."""
    workload = parse_workload(name)
    with Measurer(MeasureOptions(build_workers=2)) as measurer:
        measurer.warm_up(resources)
        return measurer.measure_batch([TrialSpec(workload, c, resources) for c in configs])


def fresh_rounds(measurer: Measurer, specs: list[TrialSpec]) -> list[dict]:
    """Each spec's record over at least :data:`BEST_ROUNDS` placements, each in a fresh process."""
    return measurer.measure_fresh(specs, placements=BEST_ROUNDS)


def share(records: list[dict], which: Callable[[dict], bool]) -> float:
    """The share of successful records ``which`` picks."""
    ok = [r for r in records if is_ok(r)]
    return sum(map(which, ok)) / max(1, len(ok))


def outside_usual(record: dict) -> bool:
    """Whether a host-speed probe found the record outside the host's usual state."""
    return not Slowness.of(record).usual


def placements_disagreed(record: dict) -> bool:
    """Whether no other placement of the record came within ``agree`` of its fastest, the estimate."""
    return record.get("placements_agreeing", 0) < 2


def torch_references(studies: int, trials: int, resources: Resources, scratch: Path) -> list[tuple[dict, dict]]:
    """Per short study on matmul-512: its torch reference's record and torch's record after the study (each over
    placements in fresh processes)."""
    workload = parse_workload("matmul-512")
    template = get_template(workload)
    out = []
    for i in range(studies):
        with Measurer(MeasureOptions(build_workers=2)) as measurer:
            measurer.warm_up(resources)
            refs = measure_references(measurer, workload, resources, lambda r: None)
            engine = OptunaEngine(template.search_space(workload), resources.threads, f"ref{i}",
                                  f"sqlite:///{scratch}/optuna.db", seed=i)
            run_tuning(engine, workload, trials, measurer, lambda r: None, resources, batch=2)
            after = measurer.measure_library(workload, "torch", resources)
        out.append((refs["torch"], after))
    return out


def _state(record: dict) -> str:
    """The host's state around a record: its compute, memory and parallel slowness."""
    return "/".join(f"{x:.3g}" for x in Slowness.of(record))


def _torch_row(study: int, before: dict, after: dict) -> tuple:
    """A study's torch reference and torch after it: each one's latency, its interval and host state."""
    return (study, before["latency_ms"], _interval(before), _state(before), after["latency_ms"], _interval(after),
            _state(after), 100 * (before["latency_ms"] / after["latency_ms"] - 1))


def _interval(record: dict) -> str:
    """A record's interval and its placements (fresh processes for a baseline)."""
    return f"{record['latency_lo_ms']:.4g}-{record['latency_hi_ms']:.4g} ({record['placements']} placements)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--studies", type=int, default=5)
    parser.add_argument("--trials", type=int, default=8, help="trials of each short study")
    parser.add_argument("--out", default=None, help="folder for the plot (default: a temporary folder)")
    args = parser.parse_args()
    resources = Resources(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="opbench-quality-"))
    out = Path(args.out) if args.out else scratch
    repeat_rows, best_rows, cvs = [], [], []
    measured: dict[str, list[dict]] = {"run A": [], "run B": [], "fresh rounds": []}
    for name in WORKLOADS:
        configs = sample_configs(name, args.configs, args.threads, seed=7)
        first, second = measure_all(name, configs, resources), measure_all(name, configs, resources)
        measured["run A"] += first
        measured["run B"] += second
        pairs = [(a, b) for a, b in zip(first, second) if is_ok(a) and is_ok(b)]
        a_ms, b_ms = np.array([a["latency_ms"] for a, _ in pairs]), np.array([b["latency_ms"] for _, b in pairs])
        cvs += [r["latency_cv"] for r in first + second if is_ok(r)]
        delta = 100 * np.abs(b_ms - a_ms) / a_ms
        repeat_rows.append((name, len(pairs), spearmanr(a_ms, b_ms).statistic, float(np.median(delta)),
                            float(np.percentile(delta, 90))))
        predicted_vs_measured(a_ms, b_ms, f"{name}: the same configs measured twice", out / f"repeatability-{name}.png",
                              labels=("run A", "run B"))
        top = sorted(pairs, key=lambda p: p[0]["latency_ms"])[:3]  # chosen by run A: B is independent of the choice
        specs = [TrialSpec(parse_workload(name), configs[first.index(a)], resources) for a, _ in top]
        with Measurer() as measurer:
            for (a, b), record in zip(top, fresh_rounds(measurer, specs)):
                measured["fresh rounds"].append(record)
                rounds = record["placement_ms"] if is_ok(record) else [float("nan")]
                fresh = record["latency_ms"] if is_ok(record) else float("nan")
                best_rows.append((name, a["latency_ms"], b["latency_ms"], _state(b), fresh,
                                  min(rounds), max(rounds), 100 * (fresh / a["latency_ms"] - 1),
                                  100 * (fresh / b["latency_ms"] - 1)))
    refs = torch_references(args.studies, args.trials, resources, scratch)

    results = Results("measurement_quality")
    results.print(f"{args.threads} threads; plots in {out}")
    results.print("\nRepeatability (same configs, two measurers in separate processes)")
    results.table(table(repeat_rows, ["workload", "configs", "Spearman", "median |delta| %", "p90 |delta| %"]))
    results.print(f"\nCV of repeats over {len(cvs)} records: median {100 * statistics.median(cvs):.2f}%, "
                  f"p90 {100 * float(np.percentile(cvs, 90)):.2f}%, max {100 * max(cvs):.2f}%")
    results.print(f"\nBest configs (the 3 fastest in run A) re-measured in fresh processes (at least {BEST_ROUNDS} placements), against\n"
                  "run A, which chose them (so its lucky measurements are among them: the winner's curse), and run B")
    results.table(table(best_rows, ["workload", "run A ms", "run B ms", "B's host state", "fresh ms (estimate)", "min", "max",
                                    "delta vs A %", "delta vs B %"]))
    results.print("records a probe found outside the host's usual state (compute, memory or parallel off by more than "
                  "10%): " +
                  ", ".join(f"{what} {100 * share(records, outside_usual):.0f}%" for what, records in measured.items()) +
                  "; records whose placements never agreed: " +
                  ", ".join(f"{what} {100 * share(records, placements_disagreed):.0f}%" for what, records in measured.items()))
    results.print("\ntorch reference of short studies vs torch after each study (matmul-512): each placement a fresh "
                  "process, and the host's state around it")
    results.table(table([_torch_row(i + 1, before, after) for i, (before, after) in enumerate(refs)],
                        ["study", "study's torch ms", "its interval", "its host state", "after ms", "its interval",
                         "its host state", "delta %"]))
    worst_best = max(abs(r[-1]) for r in best_rows)  # against run B: a trial's record, not the one that chose it
    worst_ref = max(abs(100 * (s["latency_ms"] / f["latency_ms"] - 1)) for s, f in refs)
    verdicts = [("median CV <= 2%", 100 * statistics.median(cvs) <= 2),
                ("best configs within 5% of run B in fresh processes", worst_best <= 5),
                ("Spearman >= 0.9", min(r[2] for r in repeat_rows) >= 0.9),
                ("torch references within 10%", worst_ref <= 10)]
    results.print("\n" + "\n".join(f"{'met' if ok else 'NOT MET'}: {what}" for what, ok in verdicts))
    results.save()


if __name__ == "__main__":
    main()
