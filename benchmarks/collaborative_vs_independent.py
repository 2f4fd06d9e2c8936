"""Collaborative vs independent tuning of co-running real-model layers, measured in one run.

For each pair of presets, on this machine's cores: (a) tune each operator alone on all cores, then
co-run the two winners in every core layout and keep the best; (b) tune both jointly, configs and
layout, scored on the co-run's makespan. Prints makespan, throughput and the gain per pair.

    .venv/bin/python benchmarks/collaborative_vs_independent.py [--trials 24] [--window 0.3] [--mode full]
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from _results import Results

from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.report.progress import corun_printer, table
from opbench.space import get_template
from opbench.studies.collaborative import CoTuning, compare, objective_value
from opbench.studies.corun import layouts_for
from opbench.workloads import parse_workload

PAIRS = (("matmul-512", "bert-base-softmax"),  # compute-bound next to memory-bound
         ("resnet50-c2", "mobilenetv2-dw"),  # a dense conv next to a depthwise one
         ("bert-base-attn", "bert-base-layernorm"))  # attention scores next to a normalisation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24, help="co-run trials; each operator alone gets as many")
    parser.add_argument("--window", type=float, default=0.3)
    parser.add_argument("--mode", default="full", choices=("full", "stream"))
    parser.add_argument("--objective", default="makespan", choices=("makespan", "throughput"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cores = tuple(sorted(os.sched_getaffinity(0)))
    scratch = Path(tempfile.mkdtemp(prefix="opbench-collab-"))
    log = corun_printer(None)
    rows, gains = [], []
    with Measurer(MeasureOptions(TimingPolicy(repeat=3), build_workers=2)) as measurer:
        for pair in PAIRS:
            workloads = [parse_workload(name) for name in pair]
            layouts = [l for l in layouts_for(len(workloads), cores) if args.mode == "full" or l.shared]
            tuning = CoTuning(measurer, workloads, [get_template(w) for w in workloads], layouts, args.mode,
                              args.window, args.objective, log)
            print(f"=== {' + '.join(pair)}", flush=True)
            result = compare(tuning, args.trials, f"sqlite:///{scratch / 'optuna.db'}", "+".join(pair),
                             seed=args.seed, cores=cores)
            for label, best in (("independent + co-run", result.alone), ("collaborative", result.together)):
                if best is not None:
                    rows.append((" + ".join(pair), label, best.layout.label, best.corun["makespan_ms"],
                                 best.corun["gflops_total"], objective_value(best.corun, args.objective)))
            gains.append(result.gain(args.objective))
            rows.append((" + ".join(pair), "gain (independent / collaborative), not verified", "", "", "", gains[-1]))
    results = Results("collaborative_vs_independent")
    results.print(f"\n{args.mode} co-runs on cores {cores}, {args.trials} trials per approach and operator, "
                  f"window {args.window} s, objective {args.objective}")
    results.table(table(rows, ["pair", "approach", "layout", "makespan ms", "GFLOP/s", args.objective]))
    ok = [g for g in gains if g == g]
    if ok:
        # Co-runs are not re-measured in fresh processes (verify covers single schedules): say so.
        results.print(f"geomean gain: x{math.exp(sum(math.log(g) for g in ok) / len(ok)):.3f} (not verified)")
    results.save()


if __name__ == "__main__":
    main()
