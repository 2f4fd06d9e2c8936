"""Warm start that pays: the model engine trained on other workloads' records, on workloads it never saw.

For each held-out workload (``--workloads``: three op kinds of ``predictor_heldout``'s FINAL set) and seed,
a cold Optuna TPE study of ``--trials`` (64) trials sets the bar: within 1.02x of its best. Then random
search, the model engine warm-started from the other workloads' records of a ``predictor_heldout``
collection (``--data``: the held-out task absent, its op kind present) or from the open dataset's other devices
(``--other-devices``: every task, this host's device absent, as a new device starts), and the same engine never
retrained on the study's own trials (TenSet's ``xgb-no-update``). Every arm measures the template default first and
counts trials from it; an arm stops once it reaches the bar, and one that never does counts as trials + 1.
The model ranks candidates by features known before a build (op, config, compute nest, resources, host):
no candidate is scheduled or built to be ranked. Target (issue 41): the warm engine's geomean trials to
reach <= 16.

    .venv/bin/python benchmarks/predictor_and_warm_start.py --data DIR [--seeds 3] [--trials 64]
    .venv/bin/python benchmarks/predictor_and_warm_start.py --other-devices datasets/records [--seeds 1]
"""
from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
from _results import Results
from predictor_heldout import FINAL, NESTS, RECORDS, nest_frame

from opbench.engines._base import Engine
from opbench.engines.loop import run_tuning
from opbench.engines.model_engine import ModelEngine
from opbench.engines.optuna.engine import OptunaEngine
from opbench.engines.simple import RandomEngine
from opbench.hardware.resources import Resources, host_facts
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.paths import safe_name
from opbench.record import TrialRecord, is_ok
from opbench.report.plots import engine_curves
from opbench.report.progress import table
from opbench.space import TEMPLATES, get_template
from opbench.tracking.dataset.export import read_dataset
from opbench.tracking.jsonl import read_jsonl_records, records_frame
from opbench.workloads import Workload, parse_workload, task_key_of

WORKLOADS = (FINAL[0], FINAL[3], FINAL[4])  # a matmul, a strided 3x3 conv, a depthwise conv
REACH = 1.02  # within this of the cold TPE study's best
ARMS = ("random", "model, warm", "model, warm, no update")
TARGET = 16.0


def warm_frame(folder: Path, held_out: str) -> pd.DataFrame:
    """The collection's ok records of every task but ``held_out``, with their compute-nest features."""
    records = [r for r in read_jsonl_records(folder / RECORDS) if is_ok(r) and r.get("template") in TEMPLATES
               and (r.get("task_key") or task_key_of(r["workload"])) != held_out]
    frame = records_frame(records).drop(columns=NESTS, errors="ignore")
    return frame.merge(nest_frame(folder), on="trial_id", how="left")


def other_devices_frame(root: Path) -> pd.DataFrame:
    """The open dataset's rows of every device but this host's (issue 95's warm start across devices)."""
    frame = read_dataset(root)
    return frame[frame["device_key"] != host_facts().device_key].reset_index(drop=True)


def tune(engine: Engine, workload: Workload, trials: int, measurer: Measurer, resources: Resources,
         bar: float = 0.0) -> list[TrialRecord]:
    """Up to ``trials`` trials of ``engine`` (its first the template default), two at a time, stopping at the
    first that reaches ``bar`` (0: never stop early)."""
    records: list[TrialRecord] = []
    while len(records) < trials and not (bar and reached(records, bar) <= len(records)):
        got = run_tuning(engine, workload, min(2, trials - len(records)), measurer, lambda r: None, resources, batch=2,
                         fresh=not records)
        if not got:
            break
        records += got
    return records


def reached(records: list[TrialRecord], bar: float, never: int = 0) -> int:
    """Trials (counted from the first) until one was within :data:`REACH` of ``bar``; ``never`` (else one past
    the last trial) when none was."""
    return next((i for i, r in enumerate(records, start=1) if is_ok(r) and r["latency_ms"] <= REACH * bar),
                never or len(records) + 1)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def arms(name: str, seed: int, warm: pd.DataFrame, resources: Resources, scratch: Path) -> dict[str, Engine]:
    """The engines of one workload and seed (:func:`tune` gives each the template default first)."""
    workload = parse_workload(name)
    template = get_template(workload)
    space = template.search_space(workload)
    model = lambda update: ModelEngine(space, resources, workload, template, seed, warm, update=update)
    return {"optuna-tpe, cold": OptunaEngine(space, resources.threads, f"{workload.name}-{seed}",
                                             f"sqlite:///{scratch}/optuna.db", seed=seed),
            "random": RandomEngine(space, resources.threads, seed),
            "model, warm": model(True),
            "model, warm, no update": model(False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="a predictor_heldout collection (--collect DIR)")
    source.add_argument("--other-devices", type=Path, metavar="DATASET",
                        help="the open dataset: warm-started from every device but this host's")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    resources, scratch = Resources(args.threads), Path(tempfile.mkdtemp(prefix="opbench-warm-start-"))
    results = Results("predictor_and_warm_start")
    rows, to_reach, plots = [], {arm: [] for arm in ARMS}, []
    started = time.monotonic()
    across = other_devices_frame(args.other_devices) if args.other_devices else None
    if across is not None and across.empty:
        raise SystemExit(f"{args.other_devices} holds no device but this host's: nothing to warm-start from")
    with Measurer(MeasureOptions(TimingPolicy(repeat=3), build_workers=2)) as measurer:
        measurer.warm_up(resources)
        for name in args.workloads:
            key = task_key_of(name) or name
            warm = across if across is not None else warm_frame(args.data, key)
            for seed in range(args.seeds):
                engines = arms(name, seed, warm, resources, scratch)
                cold = tune(engines.pop("optuna-tpe, cold"), parse_workload(name), args.trials, measurer, resources)
                bar = min(r["latency_ms"] for r in cold if is_ok(r))
                runs = {"optuna-tpe, cold": cold}
                print(f"{name} seed {seed}: cold TPE's best {bar:.4g} ms ({time.monotonic() - started:.0f} s so far)",
                      flush=True)
                for arm, engine in engines.items():
                    runs[arm] = tune(engine, parse_workload(name), args.trials, measurer, resources, bar)
                    to_reach[arm].append(reached(runs[arm], bar, args.trials + 1))
                    print(f"  {arm}: {to_reach[arm][-1]} trials to reach", flush=True)
                for arm, records in runs.items():
                    rows.append((name, seed, arm, len(records), f"{bar:.4g}", reached(records, bar, args.trials + 1)))
                if seed == 0:
                    plots.append(engine_curves(runs, {}, f"{name}: warm start vs cold", scratch / f"{safe_name(key)}.png"))
    source = (f"{args.data / RECORDS} without the held-out task" if across is None else
              f"{args.other_devices}, {len(across)} rows of {', '.join(sorted(set(across['device_key'])))} (not this host's)")
    results.print(f"{len(args.workloads)} held-out workloads x {args.seeds} seeds; warm start: {source}; "
                  f"reached = within {REACH}x of the cold TPE study's best of "
                  f"{args.trials}; never reached = {args.trials + 1}; {time.monotonic() - started:.0f} s")
    results.table(table(rows, ["workload", "seed", "arm", "trials run", "bar ms", "trials to reach"]))
    results.table(table([(arm, f"{geomean(v):.1f}", min(v), max(v)) for arm, v in to_reach.items()],
                        ["arm", "geomean trials to reach", "min", "max"]))
    warm = geomean(to_reach["model, warm"])
    results.print(f"warm engine: geomean {warm:.1f} trials to reach: target <= {TARGET:.0f} "
                  f"{'met' if warm <= TARGET else 'NOT MET'}; plots: {', '.join(map(str, plots))}")
    results.save()


if __name__ == "__main__":
    main()
