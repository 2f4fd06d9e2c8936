"""``opbench tune``, ``worker``, ``verify``, ``report`` and ``demo``: studies, their verification and reports."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from opbench.argtypes import nonneg_int, positive_int
from opbench.cli._common import (
    BATCH_RENAMED,
    add_measure_flags,
    add_renamed_flag,
    add_timing_flags,
    invoked_as,
    measure_options,
    resources_of,
)
from opbench.engines.nni.engine import TUNERS
from opbench.engines.optuna.storage import STORAGE_ENV, STORAGE_HELP
from opbench.engines.registry import ENGINES
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import parse_thread_counts
from opbench.record import OBJECTIVE_COLUMNS, ok_records
from opbench.report.progress import TrialPrinter, table
from opbench.urls import masked

if TYPE_CHECKING:
    from opbench.studies.tune import StudyResult, TuneSpec


def tune_spec(args: argparse.Namespace) -> TuneSpec:
    """The study ``opbench tune`` asks for; the specs check the combination (their errors name the flag)."""
    from opbench.engines.registry import EngineSpec
    from opbench.studies.tune import TuneSpec

    resources = resources_of(args, args.threads)
    objectives = tuple(o.strip() for o in args.objectives.split(",") if o.strip())
    if "energy" in objectives and not resources.remote:  # a board's meter shows itself per trial
        from opbench.hardware.energy import require_local_meter
        from opbench.hardware.targets import is_gpu

        require_local_meter(is_gpu(resources.target))
    engine = EngineSpec(args.engine, args.sampler, args.tuner, args.seed, args.storage, objectives, args.warm_start)
    return TuneSpec(
        args.workload, args.trials, engine, resources, args.template, args.study,
        tuple(parse_thread_counts(args.search_threads, "--search-threads")) if args.search_threads else (),
        tuple(c.strip() for c in args.search_cores.split(";") if c.strip()) if args.search_cores else (),
        args.configs_per_step, args.workers, args.resume, not args.no_references, args.verify_rounds, measure_options(args),
        args.tracking_uri, args.log)


def cmd_tune(args: argparse.Namespace) -> int:
    from opbench.studies.tune import run_study
    from opbench.tracking import how_to_open

    spec = tune_spec(args)
    printer = TrialPrinter(spec.trials)
    result = run_study(spec, on_record=printer)
    print_study(result)
    if waited := printer.host_wait_line():
        print(waited)
    print(f"MLflow experiment '{result.study}' in {masked(result.tracking_uri)}")
    print(how_to_open(result.study, result.tracking_uri, invoked_as()))
    return 0 if result.best else 1


def cmd_worker(args: argparse.Namespace) -> int:
    from opbench.studies.shared import WorkerSpec
    from opbench.studies.tune import run_worker

    printer = TrialPrinter(None)
    run_worker(WorkerSpec(args.study, args.storage, args.tracking_uri, args.log, args.any_cpu), on_record=printer)
    print(f"this host measured {printer.count} trial(s) of study '{args.study}'; its budget is spent")
    return 0


def print_study(result: StudyResult) -> None:
    """The speed-up table (verified, or "not verified"), the best config, the plots and the Pareto front."""
    from opbench.report.progress import changed_knobs
    from opbench.studies.claims import speedup_table

    best = result.best
    print(speedup_table(best, result.references, result.verification))
    if best:
        print(f"\nbest config: {changed_knobs(best) or '(no knobs)'} threads={best['threads']}")
    print(f"tuning curve: {result.plots['tuning_curve']} (also an artifact of the study's parent run)")
    if "pareto_front" in result.plots:
        other = result.objectives[1]
        column = OBJECTIVE_COLUMNS[other]
        print(f"\nPareto front (latency vs {other}):")
        verified = {t: f"{s.median:.4g} ({s.lo:.4g}-{s.hi:.4g})" for t, s in result.pareto_verified.items()}
        print(table([(r[column], r["latency_ms"], verified.get(r["trial_id"], "not verified"), r["gflops"], r["threads"],
                      changed_knobs(r)) for r in result.pareto],
                    [column, "latency_ms", "verified ms (min-max)", "GFLOP/s", "threads", "config"]))
        print(f"Pareto plot: {result.plots['pareto_front']}")
    print(f"{len(ok_records(result.records))}/{len(result.records)} trials ok; "
          f"{result.rejected} invalid configs rejected before measuring (built-in spaces: always 0).")


def cmd_report(args: argparse.Namespace) -> int:
    from opbench.report.summary import summary_table, write_report
    from opbench.tracking import KIND_TAG, Recorder, read_mlflow_records, study_dir, verified_claims

    records = read_mlflow_records(args.studies, args.tracking_uri)
    out = Path(args.out) if args.out else study_dir("reports", "+".join(args.studies), args.tracking_uri)
    title = ", ".join(sorted({r.get("workload", "?") for r in records}))
    summaries, paths = write_report(records, title, out, verified_claims(args.studies, args.tracking_uri))
    print(summary_table(summaries))
    with Recorder(args.studies[0], args.tracking_uri, parent_tags={KIND_TAG: "report", "mlflow.runName": "report"}) \
            as recorder:
        for path in paths:
            recorder.log_artifact(path, "report")
    print("\n" + "\n".join(f"wrote {p}" for p in paths))
    print(f"(also artifacts of the 'report' run in MLflow experiment '{args.studies[0]}')")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from opbench.measure.measurer import Measurer
    from opbench.report.study_records import references
    from opbench.studies.claims import speedup_table
    from opbench.studies.verify import contenders_of, verified_best, verify
    from opbench.tracking import Recorder, latest_parent_run, read_mlflow_records

    parent = args.run or latest_parent_run(args.study, args.tracking_uri)
    with Measurer(measure_options(args)) as measurer, \
            Recorder(args.study, args.tracking_uri, args.log, parent_run_id=parent) as recorder:
        records = read_mlflow_records([args.study], args.tracking_uri, parent)  # after the write-ahead log's replay
        if not records:
            raise OpBenchError(f"run {parent} of MLflow experiment '{args.study}' has no trials to verify")
        refs = references(records)
        print(f"verifying '{args.study}' run {parent}: the fastest of its {len(contenders_of(records))} contenders (its "
              f"best configs and its default, timed in fresh processes), then it and {', '.join(refs) or 'no reference'} "
              f"in fresh processes, {args.rounds} alternating rounds", file=sys.stderr)
        verification = verify(measurer, records, args.study, args.rounds, recorder)
        recorder.log_parent(metrics=verification.parent_metrics(), tags=verification.parent_tags())
    print(speedup_table(verified_best(records, verification), refs, verification))
    print(f"recorded on run {parent} of MLflow experiment '{args.study}' ({masked(recorder.uri)})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``opbench tune`` on the demo's study, its flags parsed by the tune command's own parser."""
    return cmd_tune(args.tune_parser.parse_args(
        ["matmul-512", "--engine", "optuna", "--sampler", "tpe", "--trials", str(args.trials), "--threads",
         str(args.threads), "--study", "demo-matmul-512", "--seed", "0", "--configs-per-step", "2"]))


def register(sub: argparse._SubParsersAction) -> None:
    tune = p = sub.add_parser("tune", help="tune a workload with an engine (Optuna, NNI, random, grid, MetaSchedule)")
    add_measure_flags(p)
    p.add_argument("--engine", default="optuna", choices=ENGINES,
                   help="who proposes configs: Optuna, an NNI tuner in-process, random, grid, or TVM's MetaSchedule")
    p.add_argument("--sampler", default="tpe", help="Optuna sampler: tpe, random, cmaes, gp, nsga2, grid")
    p.add_argument("--tuner", default="TPE", choices=TUNERS, help="NNI tuner for --engine nni")
    p.add_argument("--warm-start", metavar="DATASET", help="--engine model: train the first model on these logs")
    p.add_argument("--objectives", default="latency",
                   help="Optuna objectives to minimise: latency, or latency,threads, latency,energy (joules per call) or "
                        "latency,memory (the schedule's workspace bytes) for a Pareto front")
    p.add_argument("--workers", type=positive_int, default=1, help="Optuna worker processes sharing the study's storage")
    p.add_argument("--trials", type=nonneg_int, default=64)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--search-threads", metavar="LIST", help="also search the thread count among these, e.g. 1,2")
    p.add_argument("--search-cores", metavar="SETS", help="also search the core set among these, e.g. '0;1;0,1'")
    p.add_argument("--configs-per-step", type=positive_int, default=1,
                   help="configs proposed, built in parallel, then timed, per step")
    add_renamed_flag(p, "--batch", BATCH_RENAMED)
    p.add_argument("--seed", type=int)
    p.add_argument("--storage", default=os.environ.get(STORAGE_ENV), help=STORAGE_HELP)
    p.add_argument("--resume", action="store_true", help="continue the study instead of starting it afresh")
    p.add_argument("--no-references", action="store_true", help="skip TE-default/torch/numpy reference timings")
    p.add_argument("--verify-rounds", type=nonneg_int, default=None, metavar="N",
                   help="re-measure the best and the references in fresh processes, N alternating rounds "
                        "(default: 2 up to 32 trials, one more per 16 trials, at most 5; 0: skip, speed-ups "
                        "are then printed as not verified)")
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser("worker", help="take trials of a running study on this host until its budget is spent")
    p.add_argument("--study", required=True, help="the study `opbench tune --study NAME --storage URL` runs")
    p.add_argument("--storage", default=os.environ.get(STORAGE_ENV), required=not os.environ.get(STORAGE_ENV),
                   help=f"the study's Optuna storage: a database URL every host reaches (default ${STORAGE_ENV})")
    p.add_argument("--tracking-uri", help="MLflow server every host reaches (default: the study's)")
    p.add_argument("--log", help="also append this host's records to a JSON-lines file")
    p.add_argument("--any-cpu", action="store_true", help="join although this host's CPU model differs from the study's")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("verify", help="re-measure a study's best config and references in fresh processes")
    p.add_argument("study", help="MLflow experiment of the study")
    p.add_argument("--run", metavar="RUN_ID", help="the invocation (parent run) to verify (default: the latest)")
    p.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds (each schedule once per round)")
    add_timing_flags(p)
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("report", help="tuning curves, latency vs threads, best TIR and a table of a study")
    p.add_argument("studies", nargs="+", metavar="STUDY", help="MLflow experiment(s) to report on together")
    p.add_argument("--tracking-uri")
    p.add_argument("--out", help="folder for the PNGs and TIR (default mlflow/reports/<study>)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("demo", help="the main job: an Optuna TPE study on matmul-512")
    p.add_argument("--trials", type=nonneg_int, default=60)
    p.add_argument("--threads", type=positive_int, default=min(2, len(os.sched_getaffinity(0))))
    p.set_defaults(func=cmd_demo, tune_parser=tune)
