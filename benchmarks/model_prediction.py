"""Whole-model latency predicted from its operators' (issue 95): held-out zoo models, leave-one-model-out.

Each model is built with its operators' template defaults; every fused operator is timed alone as the model runs
it, warm (the state of the catalogue's records), and the model built; then the models are timed (their outputs
checked) in :data:`FRESH` new processes each, interleaved, the product's estimate over them: a model timed alone on
a shared host may sit in a slow spell throughout (SqueezeNet's 4.6-5.1 ms at 10.2-10.5 ms in two runs), and such a
model also moves the composition fitted for the others. For each model in turn, the operator predictor (XGBoost,
static features; :data:`SEEDS` of them, their predictions averaged in log space) is trained on this device's
catalogue records in the open dataset and the other models' operators (weighing as much in all); the composition
(:mod:`opbench.predictor.whole_model`: a scale on the sum of calls x predicted ms, fitted on the other models'
operators as measured, and a cost per call, timed on chains of calls, :mod:`opbench.studies.models.call_cost`);
nothing of the held-out model is seen. Beside it: the plain sums of the predicted operators and of the measured ones
(TenSet's own log: ResNet-50's per-task latencies summed to 7.98 ms, the model ran in 6.08).

Usage::

    .venv/bin/python benchmarks/model_prediction.py --keep /tmp/opbench-model-prediction
"""
from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from _results import Results

from opbench.hardware.resources import host_facts
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.predictor.model import LatencyModel, feature_columns, trainable
from opbench.predictor.whole_model import leave_one_model_out, source_balance
from opbench.report.plots import predicted_vs_measured
from opbench.report.progress import table
from opbench.studies.models.call_cost import build_chains, chain_names, per_call_ms
from opbench.studies.models.tune import ModelSpec
from opbench.studies.models.with_defaults import build_with_defaults, kept_build, time_interleaved
from opbench.tracking.dataset import read_dataset

MODELS = ("small-cnn", "squeezenet1.1", "mobilenet-v2", "resnet-18", "resnet-34", "resnet-50", "yolov3-tiny", "dcgan",
          "vgg-16", "convnext-tiny", "vit-base", "bert-base")
DATASET = Path(__file__).resolve().parent.parent / "datasets" / "records"
TARGET_MEDIAN, TARGET_EACH = 10.0, 20.0  # % of the measured latency (issue 95)
# XGBoost's row and column sampling: one seed's predictor put the 12 models' median error anywhere from 7.4% to 11.0%
# (and a model's error from +16% to +37%) on the same data; the average of several is the number that holds
SEEDS = 5
FRESH = 5  # placements of each whole model, each in a new process
OPERATORS, LATENCY = "operators.parquet", "model.ms"  # in a model's folder of --keep


def measured(models: list[str], threads: int, fresh: int, keep: Path) -> tuple[pd.DataFrame, dict[str, float], float]:
    """Every model's operator rows and latency, and the cost of a call (ms): read from ``keep`` where a run kept
    them, else measured and kept (each model's operators and build first, then what is not yet timed, together: the
    models and the two chains of :mod:`opbench.studies.models.call_cost`)."""
    with Measurer(MeasureOptions(TimingPolicy())) as measurer:
        for n, model in enumerate(models, start=1):
            folder = keep / model
            if not (folder / OPERATORS).is_file():
                print(f"[{n}/{len(models)}] {model}: measuring its operators and building it", flush=True)
                folder.mkdir(exist_ok=True)
                spec = ModelSpec(model, 1, 128, threads, TimingPolicy())
                built = build_with_defaults(spec, measurer, folder, lambda i, op, ms: print(
                    f"    {op.name[:60]:60s} {ms:9.4f} ms x {op.calls}", flush=True))
                built.ops.to_parquet(folder / OPERATORS)  # last: its presence says the build is whole
        runs = [kept_build(m, keep / m, threads) for m in models if not (keep / m / LATENCY).is_file()]
        if not all((keep / chain / LATENCY).is_file() for chain in chain_names()):
            runs += build_chains(keep, threads)
        if runs:
            print(f"timing {len(runs)} models, {fresh} placements each in new processes, interleaved", flush=True)
            for run, ms in zip(runs, time_interleaved(measurer, runs, fresh)):
                (keep / run.model / LATENCY).write_text(f"{ms!r}\n")
                Path(run.library).unlink()  # up to 550 MB (VGG-16's weights), no longer needed once timed
    ops = pd.concat([pd.read_parquet(keep / m / OPERATORS) for m in models], ignore_index=True)
    latency = lambda name: float((keep / name / LATENCY).read_text())
    return ops, {m: latency(m) for m in models}, per_call_ms(*map(latency, chain_names()))


def catalogue_records(root: Path) -> pd.DataFrame:
    """This device's records in the open dataset (every device's where it holds none of this one's)."""
    frame = trainable(read_dataset(root))
    own = frame[frame["device_key"] == host_facts().device_key]
    return own if len(own) else frame


def trainer(seeds: int) -> Callable[[pd.DataFrame], Callable[[pd.DataFrame], np.ndarray]]:
    """XGBoost on the features known before a build, the models' operators weighing as much as the catalogue's
    records, ``seeds`` of them averaged in log space (:data:`opbench.predictor.whole_model.TrainPredictor`)."""
    def train(frame: pd.DataFrame) -> Callable[[pd.DataFrame], np.ndarray]:
        rows = trainable(frame)
        columns, weights = feature_columns(rows, static_only=True), source_balance(rows)
        models = [LatencyModel(columns, seed=seed).fit(rows, weights) for seed in range(seeds)]
        return lambda ops: np.exp(np.mean([np.log(model.predict(ops)) for model in models], axis=0))

    return train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--seeds", type=int, default=SEEDS, help="operator predictors averaged (XGBoost seeds)")
    parser.add_argument("--fresh", type=int, default=FRESH, help="each whole model's placements, each in a new process")
    parser.add_argument("--keep", type=Path, default=None,
                        help="folder keeping each model's measurements; a re-run reads them instead of measuring")
    args = parser.parse_args()
    keep = args.keep or Path(tempfile.mkdtemp(prefix="opbench-model-prediction-"))
    keep.mkdir(parents=True, exist_ok=True)
    results = Results("model_prediction")
    kept = [m for m in args.models if (keep / m / LATENCY).is_file()]
    if kept:
        results.print(f"read from {keep}, as an earlier run measured them: {', '.join(kept)}")
    ops, latencies, per_call = measured(args.models, args.threads, args.fresh, keep)
    catalogue = catalogue_records(args.dataset)
    results.print(f"{len(latencies)} models at batch 1, {args.threads} threads, built with their template defaults, "
                  f"each model timed in {args.fresh} new processes; "
                  f"{len(ops)} operators; the operator predictor also trained on {len(catalogue)} catalogue records "
                  f"of {catalogue['device_key'].nunique()} device(s) from {args.dataset.name}, {args.seeds} seed(s); "
                  f"a call on the Relax VM measured at {per_call * 1e3:.2f} us")
    scored = leave_one_model_out(catalogue, ops, latencies, trainer(args.seeds), per_call)
    scored["ops_sum_error_pct"] = 100 * (scored["ops_predicted_ms"] / scored["measured_ms"] - 1)
    composed = scored["scale"] * scored["ops_measured_ms"] + scored["per_call_us"] / 1e3 * scored["calls"]
    scored["composition_error_pct"] = 100 * (composed / scored["measured_ms"] - 1)  # its own measured operators
    results.table(table(scored[["model", "calls", "measured_ms", "ops_measured_ms", "ops_predicted_ms",
                                "ops_sum_error_pct", "scale", "per_call_us", "composition_error_pct", "predicted_ms",
                                "error_pct"]].round(4).values.tolist(),
                        ["model", "calls", "measured ms", "ops alone, measured", "ops predicted", "sum error %",
                         "scale", "us/call", "composed measured ops, error %", "predicted ms", "error %"]))
    errors = scored["error_pct"].abs()
    median, worst = float(errors.median()), float(errors.max())
    plain, own = (float(scored[c].abs().median()) for c in ("ops_sum_error_pct", "composition_error_pct"))
    results.print(f"median |error| {median:.1f}% (the plain sum of predicted operators: {plain:.1f}%; the composition "
                  f"of the model's own measured operators: {own:.1f}%, the error the operator predictor does not add), worst "
                  f"{worst:.1f}% ({scored.loc[errors.idxmax(), 'model']}); target (issue 95): median <= {TARGET_MEDIAN:.0f}%, "
                  f"every model within {TARGET_EACH:.0f}%: {'MET' if median <= TARGET_MEDIAN and worst <= TARGET_EACH else 'NOT MET'}")
    plot = predicted_vs_measured(scored["measured_ms"], scored["predicted_ms"],
                                 "whole models, leave-one-model-out", keep / "model_prediction.png")
    results.print(f"plot: {plot}; measurements kept in {keep}")
    results.save()


if __name__ == "__main__":
    main()
