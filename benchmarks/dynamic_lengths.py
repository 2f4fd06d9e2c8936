"""A model with a dynamic dimension (a token model's sequence length, a CNN's batch) against PyTorch eager at
each size it runs (issue 93: the dynamic BERT <= 0.9x eager at each length).

The model is imported once with that dimension symbolic and tuned at each bucket (``tune-model --seq-len`` or
``--batch-size``); each bucket's tuned build is verified against eager at that size in fresh processes, and each
``--between`` size runs through the dispatcher on the next bucket up, padded, checked against eager at that size
and timed beside it in fresh processes (``studies/models/bucketed.py``). Every ratio printed is verified (median,
per-round range).

    .venv/bin/python benchmarks/dynamic_lengths.py [--model bert-base] [--buckets 32,64,128,256] [--between 48]
        [--trials-per-op 8] [--max-ops 4] [--threads 2] [--rounds 3]
    .venv/bin/python benchmarks/dynamic_lengths.py --model resnet-18 --buckets 1,4,16 --between 8
"""
from __future__ import annotations

import argparse
import logging

from _results import Results

from opbench.argtypes import lengths, positive_int
from opbench.engines.registry import EngineSpec
from opbench.report.progress import table
from opbench.studies.claims import spread_text
from opbench.studies.models.bucketed import dynamic_axis, tune_bucketed
from opbench.studies.models.systems import EAGER_ROW
from opbench.studies.models.tune import ModelSpec, ModelTuneSpec
from opbench.studies.verify import BEST

TARGET = 0.9  # x eager at each size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--buckets", type=lengths, default=(32, 64, 128, 256))
    parser.add_argument("--between", type=lengths, default=(48,))
    parser.add_argument("--trials-per-op", type=positive_int, default=8)
    parser.add_argument("--max-ops", type=positive_int, default=4)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    spec = ModelTuneSpec(ModelSpec(args.model, threads=args.threads), args.trials_per_op, args.max_ops,
                         EngineSpec(seed=0), args.rounds, f"dynamic-{args.model}", systems=(EAGER_ROW,))
    axis = dynamic_axis(args.model)
    result = tune_bucketed(spec, axis, args.buckets, args.between)
    rows = []
    for bucket, tuned in result.buckets.items():
        assert tuned.verification is not None
        rows.append((bucket, bucket, "its own bucket", tuned.verification.ratio(BEST, EAGER_ROW)))
    for run in result.between:
        assert run.verification is not None
        rows.append((run.dispatched.size, run.dispatched.bucket, "padded", run.verification.ratio(BEST, EAGER_ROW)))
    out = Results("dynamic_lengths")
    fixed = "" if axis.name == "batch" else ", batch 1"
    out.print(f"{args.model}, its {axis.noun} dynamic{fixed}, {args.threads} threads, {args.trials_per_op} trials "
              f"per operator, at most {args.max_ops} operators tuned per bucket, {args.rounds} fresh-process rounds; "
              f"target <= {TARGET}x eager at each {axis.noun}")
    out.table(table([(size, bucket, how, spread_text(ratio), _verdict(ratio.median if ratio else None))
                     for size, bucket, how, ratio in sorted(rows)],
                    [axis.noun, "bucket", "how", "ours / eager (min-max)", f"<= {TARGET}x"]))
    out.save()


def _verdict(median: float | None) -> str:
    return "not verified" if median is None else "met" if median <= TARGET else "NOT MET"


if __name__ == "__main__":
    main()
