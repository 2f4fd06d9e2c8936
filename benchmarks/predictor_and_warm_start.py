"""The latency predictor and the model engine warm-started from old logs, measured in one run.

(a) Collect a dataset: random-search trials on several real-layer workloads (plus the target's cold
    TPE study below); train the XGBoost predictor on a by-op split (whole operators held out) and
    print MAPE, R² of log-latency, Spearman, share within ±10%, TenSet top-1/top-5.
(b) On the target (matmul-512): a cold Optuna TPE study of --cold-trials trials sets the bar (its
    best latency). Then the model engine warm-started from the *other* workloads' logs, cold TPE and
    random: trials until each first reaches the bar, and within 5% of it.

    .venv/bin/python benchmarks/predictor_and_warm_start.py [--cold-trials 200] [--data-trials 40]
"""
from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import pandas as pd
from _results import Results

from opbench.engines.loop import run_tuning
from opbench.engines.model_engine import ModelEngine
from opbench.engines.optuna.engine import OptunaEngine
from opbench.engines.simple import RandomEngine
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.predictor.model import LatencyModel, evaluate, split
from opbench.record import is_ok
from opbench.report.plots import engine_curves
from opbench.report.progress import TrialPrinter, table
from opbench.space import get_template
from opbench.tracking.jsonl import records_frame
from opbench.workloads import parse_workload

TARGET = "matmul-512"
OTHERS = ("matmul-1024", "bert-base-ffn2", "bert-base-attn", "resnet50-c5", "mobilenetv2-dw", "bert-base-softmax",
          "resnet50-add-relu")


def tune(engine, name: str, trials: int, measurer: Measurer, resources: Resources, label: str) -> list[dict]:
    printer = TrialPrinter(trials)
    print(f"--- {name}: {label}, {trials} trials", flush=True)
    return run_tuning(engine, parse_workload(name), trials, measurer,
                      lambda r: (r.update(engine=label), printer(r)), resources, batch=2)


def space_of(name: str):
    workload = parse_workload(name)
    template = get_template(workload)
    return workload, template, template.search_space(workload)


def trials_to_reach(records: list[dict], bar: float) -> float:
    for i, r in enumerate(records, start=1):
        if is_ok(r) and r["latency_ms"] <= bar:
            return i
    return math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-trials", type=int, default=200)
    parser.add_argument("--data-trials", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    resources = Resources(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="opbench-predictor-"))
    runs: dict[str, list[dict]] = {}
    with Measurer(MeasureOptions(TimingPolicy(repeat=3), build_workers=2)) as measurer:
        measurer.warm_up(resources)
        others = []
        for name in OTHERS:
            _, _, space = space_of(name)
            others += tune(RandomEngine(space, args.threads, args.seed), name, args.data_trials, measurer, resources,
                           "random")
        workload, template, space = space_of(TARGET)
        cold = OptunaEngine(space, args.threads, "cold", f"sqlite:///{scratch}/optuna.db", seed=args.seed,
                            initial=template.default_config(workload))
        runs["optuna-tpe (cold)"] = tune(cold, TARGET, args.cold_trials, measurer, resources, "optuna-tpe")
        warm = ModelEngine(space, resources, workload, template, args.seed, records_frame(others))
        runs["model (warm-started)"] = tune(warm, TARGET, args.cold_trials, measurer, resources, "model-warm")
        runs["model (cold)"] = tune(ModelEngine(space, resources, workload, template, args.seed), TARGET,
                                    args.cold_trials, measurer, resources, "model-cold")
        runs["random"] = tune(RandomEngine(space, args.threads, args.seed + 1), TARGET, args.cold_trials, measurer,
                              resources, "random")

    data = records_frame(others + runs["optuna-tpe (cold)"])
    train, test = split(data, "by-op", seed=args.seed)
    metrics = evaluate(LatencyModel(seed=args.seed).fit(train), test)
    results = Results("predictor_and_warm_start")
    results.print(f"\n(a) predictor, by-op split: trained on {len(train)} trials of ops {sorted(set(train['op']))}, "
                  f"tested on {len(test)} of {sorted(set(test['op']))}")
    results.table(table([list(metrics.values())], list(metrics)))

    bar = min(r["latency_ms"] for r in runs["optuna-tpe (cold)"] if is_ok(r))
    rows = []
    for label, records in runs.items():
        best = min((r["latency_ms"] for r in records if is_ok(r)), default=math.nan)
        rows.append((label, len(records), best, trials_to_reach(records, bar), trials_to_reach(records, 1.05 * bar)))
    results.print(f"\n(b) {TARGET}: bar = cold TPE's best of {args.cold_trials} trials = {bar:.4f} ms "
                  f"(warm start: {len(others)} trials of {', '.join(OTHERS)})")
    results.table(table(rows, ["engine", "trials", "best_ms", "trials to bar", "trials to bar+5%"]))
    plot = engine_curves(runs, {}, f"{TARGET}: cold TPE vs warm-started model", scratch / "warm_start.png")
    pd.DataFrame(data).to_parquet(scratch / "dataset.parquet")
    results.print(f"\nplot: {plot}; dataset: {scratch / 'dataset.parquet'}")
    results.save()


if __name__ == "__main__":
    main()
