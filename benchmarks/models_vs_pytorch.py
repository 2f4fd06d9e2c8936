"""Whole models, tuned operator by operator, against PyTorch eager and untuned TVM, in one run.

For each model (bert-base batch 1 seq 128, resnet-50 and mobilenet-v2 batch 1): extract and time
the fused operators, tune the key ones (>= 90% of the time) with a fixed per-operator budget, build
the model with the tuned schedules (a MetaSchedule database) and time it: the Ansor-style table.

    .venv/bin/python benchmarks/models_vs_pytorch.py [--trials-per-op 16] [--threads 2] [--max-ops 12]
"""
from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from opbench.cli import build_parser
from opbench.cli_models import tune_model
from opbench.progress import table

MODELS = (("bert-base", ["--seq-len", "128"]), ("resnet-50", []), ("mobilenet-v2", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-op", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-ops", type=int, default=12, help="key operators tuned per model, largest first")
    parser.add_argument("--models", nargs="+", default=[m for m, _ in MODELS])
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="opbench-models-"))
    extra = dict(MODELS)
    rows = []
    for model in args.models:
        print(f"=== {model}", flush=True)
        cli_args = build_parser().parse_args([
            "tune-model", model, "--batch", "1", *extra.get(model, []), "--threads", str(args.threads),
            "--trials-per-op", str(args.trials_per_op), "--max-ops", str(args.max_ops), "--repeat", "3",
            "--tracking-uri", f"sqlite:///{scratch / 'mlflow.db'}", "--storage", f"sqlite:///{scratch / 'optuna.db'}"])
        m = tune_model(cli_args)["metrics"]
        rows.append((model, 1, m["torch_ms"], m["untuned_ms"], m["tuned_ms"], m["speedup_vs_untuned"],
                     m["speedup_vs_torch"], int(m["tuned_ops"])))
    print(f"\n{args.threads} threads, {args.trials_per_op} trials per key operator (at most {args.max_ops} per model)")
    print(table(rows, ["network", "batch", "PyTorch ms", "TVM untuned ms", "TVM tuned ms", "x untuned", "x PyTorch",
                       "ops tuned"]))
    ratios = [r[6] for r in rows if r[6] == r[6]]
    if ratios:
        print(f"geomean speed-up over PyTorch: x{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
