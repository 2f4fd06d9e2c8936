"""Tuning engines at an equal trial budget, against TVM's MetaSchedule and PyTorch, in one run.

For matmul-512, resnet50-c2 and bert-base-ffn1 (same threads, same measurer, same MLflow store):
Optuna TPE, NNI's TPE tuner (in-process), uniform random and MetaSchedule each get the same number
of trials; MetaSchedule also gets ``--anchor-multiple`` times as many (a stronger anchor: "our 64
against their 512", measured in the same run). Per engine: best latency (median of repeats),
GFLOP/s, trials until within 10% of its own best, wall time of the whole search (MetaSchedule's
search and cost model included), verified best / the workload's library ("library": torch; int8: ONNX Runtime,
named in its own row) and best / MetaSchedule's best at both budgets
(each engine's best named as a study names it: its fastest configs timed again in fresh processes). One
tuning-curve PNG per workload (best so far vs trial).

    .venv/bin/python benchmarks/engines_equal_budget.py [--trials 64] [--anchor-multiple 8] [--threads 2] [--out DIR]
        [--engines optuna-tpe metaschedule] [--workloads bert-base-ffn1]
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from pathlib import Path

from _results import Results

from opbench.engines.loop import run_tuning
from opbench.engines.registry import LOOP_ENGINES, EngineSpec, create_engine, create_loop_engine
from opbench.hardware.resources import Resources, host_facts
from opbench.measure.measurer import Measurer
from opbench.measure.types import MeasureOptions
from opbench.record import is_ok
from opbench.report.plots import engine_curves
from opbench.report.progress import TrialPrinter, table
from opbench.report.summary import summarize_engine
from opbench.space import get_template
from opbench.studies.references import library_references, measure_references
from opbench.studies.verify import Spread, Verification, contenders_of, remeasure, select_best, spec_of
from opbench.tracking import Recorder
from opbench.workloads import parse_workload

WORKLOADS = ("matmul-512", "resnet50-c2", "bert-base-ffn1")
LIBRARY = "library"  # the verified row of the workload's library reference


SPECS = {"optuna-tpe": EngineSpec("optuna", "tpe"), "nni-tpe": EngineSpec("nni", tuner="TPE"), "random": EngineSpec("random"),
         "metaschedule": EngineSpec("metaschedule")}


def anchor_name(multiple: int, trials: int) -> str:
    return f"metaschedule-{multiple * trials}"


def tune(engine: str, name: str, trials: int, measurer: Measurer, sink, resources: Resources, scratch: Path, seed: int):
    """``trials`` trials of one engine from the registry (every engine but MetaSchedule starts from the template default)."""
    workload = parse_workload(name)
    spec = dataclasses.replace(SPECS[engine], seed=seed, storage=f"sqlite:///{scratch}/optuna.db")
    if spec.name in LOOP_ENGINES:
        work_dir = scratch / f"ms-{name}-{trials}"  # one MetaSchedule database per budget
        return create_loop_engine(spec, work_dir).run(workload, trials, measurer, sink, resources)
    template = get_template(workload)
    proposer = create_engine(spec, template.search_space(workload), workload, template, resources, f"{name}-{engine}")
    return run_tuning(proposer, workload, trials, measurer, sink, resources, batch=2, fresh=True)


def verify_bests(measurer: Measurer, series: dict, refs: dict, library: str, recorder) -> Verification:
    """Each engine's best, named as a study names it (its fastest contenders, with the template default
    for the engines that start from it, timed again in fresh processes), and the workload's library (torch; int8:
    ONNX Runtime) as "library", re-measured in fresh processes in 3 alternating rounds."""
    def contenders(engine: str, records: list) -> list:
        from_default = SPECS[engine].name not in LOOP_ENGINES  # MetaSchedule's schedules are not the template's
        return contenders_of([*records, refs["template_default"]] if from_default else records)
    bests = {e: select_best(measurer, contenders(e, rs), recorder) for e, rs in series.items() if any(is_ok(r) for r in rs)}
    if is_ok(refs[library]):
        bests[LIBRARY] = refs[library]
    specs = {name: spec_of(record) for name, record in bests.items()}
    tuned = {name: record["latency_ms"] for name, record in bests.items()}
    return Verification(recorder.study, 3, remeasure(measurer, specs, tuned, 3, recorder))


def _spread(verified: Verification, name: str, other: str) -> Spread | None:
    if name not in verified.schedules or other not in verified.schedules:
        return None
    return verified.ratio(name, other)


def _ratio(spread: Spread | None) -> str:
    return "not verified" if spread is None else f"{spread.median:.3g} ({spread.lo:.3g}-{spread.hi:.3g})"


def geomeans(spreads: dict[tuple[str, str], list[Spread | None]], engines: list[str], others: list[str]) -> list[tuple]:
    """Per engine, the geometric mean over workloads of its verified median ratio to each of ``others``
    ("not verified" unless every workload has one)."""
    def mean(values: list[Spread | None]) -> str:
        if not values or any(v is None for v in values):
            return "not verified"
        return f"{math.exp(sum(math.log(v.median) for v in values if v) / len(values)):.3g}"
    return [(engine, *(mean(spreads.get((engine, other), [])) for other in others)) for engine in engines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--anchor-multiple", type=int, default=8, help="MetaSchedule also runs this many times the "
                                                                        "trials (0: not)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--engines", nargs="+", choices=list(SPECS), default=list(SPECS),
                        help="engines at the equal budget (default: all)")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: a temporary folder)")
    args = parser.parse_args()
    resources = Resources(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="opbench-engines-"))
    out = Path(args.out) if args.out else scratch
    tracking = f"sqlite:///{scratch}/mlflow.db"
    anchor = anchor_name(args.anchor_multiple, args.trials)
    budgets = dict.fromkeys(args.engines, args.trials)
    if args.anchor_multiple:
        SPECS[anchor] = SPECS["metaschedule"]
        budgets[anchor] = args.anchor_multiple * args.trials
    rows: list[tuple] = []
    spreads: dict[tuple[str, str], list[Spread | None]] = {}
    others = [LIBRARY, *(["metaschedule"] if "metaschedule" in budgets else []), *([anchor] if args.anchor_multiple else [])]
    with Measurer(MeasureOptions(build_workers=2)) as measurer:
        measurer.warm_up(resources)
        for name in args.workloads:
            workload = parse_workload(name)
            with Recorder(f"engines-{name}", tracking) as recorder:
                refs = measure_references(measurer, workload, resources, recorder)
                series, summaries = {}, []
                for engine, trials in budgets.items():
                    printer = TrialPrinter(trials)
                    print(f"--- {name}: {engine}, {trials} trials", flush=True)
                    started = time.perf_counter()
                    sink = lambda r, e=engine, p=printer: (r.set(engine=e), recorder(r), p(r))
                    series[engine] = tune(engine, name, trials, measurer, sink, resources, scratch, args.seed)
                    wall = time.perf_counter() - started
                    summaries.append(dataclasses.replace(summarize_engine(engine, series[engine], refs), wall_s=wall))
                plot = engine_curves(series, refs, f"{name}: {args.trials} trials per engine", out / f"{name}.png")
                recorder.log_artifact(plot, "plots")
            library = library_references(workload, resources)[0]
            verified = verify_bests(measurer, series, refs, library, recorder)
            for s in summaries:
                ratios = [_spread(verified, s.engine, other) for other in others]
                for other, spread in zip(others, ratios):
                    spreads.setdefault((s.engine, other), []).append(spread)
                rows.append((name, s.engine, s.ok, s.best_ms, s.best_gflops, s.trials_to_10pct, s.wall_s,
                             *map(_ratio, ratios)))
            lib = verified.schedules[LIBRARY].latency if LIBRARY in verified.schedules else None
            rows.append((name, library, "-", lib.median if lib else "not verified", "-", "-", "-", "1.0",
                         *(_ratio(_spread(verified, LIBRARY, other)) for other in others[1:])))
    host = host_facts()
    results = Results("engines_equal_budget")
    results.print(f"\nhost: {host.cpu_model}, {args.threads} threads, {args.trials} trials per engine ({anchor}: "
                  f"{budgets.get(anchor, 0)}); ratios are verified latency ratios (< 1: faster), median of 3 fresh-process "
                  f"rounds (min-max)")
    results.table(table(rows, ["workload", "engine", "ok", "best_ms", "GFLOP/s", "trials_to_10%", "wall_s",
                               *(f"x {other}" for other in others)]))
    results.print(f"\ngeomean over {', '.join(args.workloads)} of the verified median ratios:")
    results.table(table(geomeans(spreads, list(budgets), others), ["engine", *(f"x {other}" for other in others)]))
    results.print(f"\nplots: {out}/*.png; records: MLflow {tracking}")
    results.save()


if __name__ == "__main__":
    main()
