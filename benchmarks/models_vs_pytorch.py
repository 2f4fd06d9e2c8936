"""Whole models, tuned operator by operator, against PyTorch eager and untuned TVM, in one run.

For each model (bert-base batch 1 seq 128, resnet-50 and mobilenet-v2 batch 1): extract and time
the fused operators, tune the key ones (>= 90% of the time) with a fixed per-operator budget, build
the model with the tuned schedules (a MetaSchedule database) and time it: the Ansor-style table.
The last column is the tuned latency over PyTorch's, round by round (the targets are stated so).
Every latency and speed-up printed is verified: the tuned and untuned builds and PyTorch eager are
timed again in fresh processes, 5 alternating rounds (median, with the per-round range): the host's slow
spells last up to tens of seconds and can take a whole round.

    .venv/bin/python benchmarks/models_vs_pytorch.py [--trials-per-op 16] [--threads 2] [--max-ops 12] [--rounds 5]
"""
from __future__ import annotations

import argparse
import logging
import math
import tempfile
from pathlib import Path

from _results import Results

from opbench.engines.registry import EngineSpec
from opbench.report.progress import table
from opbench.studies.models.tune import ModelSpec, ModelTuneSpec, tune_model
from opbench.studies.verify import BEST

MODELS = ("bert-base", "resnet-50", "mobilenet-v2")  # batch 1; bert-base with 128 tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-op", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-ops", type=int, default=12, help="key operators tuned per model, largest first")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="fresh-process verification rounds")
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s")  # progress on stderr: each operator as it is tuned, the verification
    logging.getLogger("opbench").setLevel(logging.INFO)
    scratch = Path(tempfile.mkdtemp(prefix="opbench-models-"))
    rows, ratios = [], []
    for model in args.models:
        print(f"=== {model}", flush=True)
        spec = ModelTuneSpec(ModelSpec(model, batch=1, seq_len=128, threads=args.threads, repeat=3), args.trials_per_op,
                             args.max_ops, EngineSpec(seed=0, storage=f"sqlite:///{scratch / 'optuna.db'}"),
                             verify_rounds=args.rounds, tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}")
        verified = tune_model(spec).verification
        assert verified is not None, "--rounds must be >= 1: every number printed here is verified"
        lat = {name: schedule.latency for name, schedule in verified.schedules.items()}
        ups = {name: verified.speedup(name) for name in ("untuned", "torch") if name in verified.schedules}
        latency_ratio = verified.ratio(BEST, "torch") if "torch" in verified.schedules else None
        rows.append((model, 1, *(_show(lat.get(n)) for n in ("torch", "untuned", BEST)),
                     *(_show(ups.get(n)) for n in ("untuned", "torch")), _show(latency_ratio)))
        if ups.get("torch"):
            ratios.append(ups["torch"].median)
    results = Results("models_vs_pytorch")
    results.print(f"\n{args.threads} threads, {args.trials_per_op} trials per key operator (at most {args.max_ops} per model); "
                  f"verified: median of {args.rounds} fresh-process rounds (min-max)")
    results.table(table(rows, ["network", "batch", "PyTorch ms", "TVM untuned ms", "TVM tuned ms", "x untuned", "x PyTorch",
                               "latency / PyTorch"]))
    if ratios:
        results.print(f"geomean verified speed-up over PyTorch: x{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    results.save()


def _show(spread) -> str:
    return "not verified" if spread is None else f"{spread.median:.4g} ({spread.lo:.4g}-{spread.hi:.4g})"

if __name__ == "__main__":
    main()
