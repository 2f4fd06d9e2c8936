"""``opbench study threads|corun``: thread scaling of workloads' default and best configs, and the
slowdown of workloads co-running in pairs."""
from __future__ import annotations

import argparse
import math

from opbench.exceptions import OpBenchError
from opbench.record import is_ok
from opbench.report.progress import TrialPrinter, corun_line, table


def cmd_study_threads(args: argparse.Namespace) -> int:
    from opbench.hardware.resources import Resources, parse_thread_counts
    from opbench.measure.features import op_features
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions, TrialSpec
    from opbench.paths import safe_name
    from opbench.report.plots import thread_scaling
    from opbench.space import get_template
    from opbench.studies.threads import Scaling, best_config, fit_turning_points
    from opbench.tracking import Recorder, read_mlflow_records
    from opbench.tracking.mlflow_store import study_dir
    from opbench.workloads import parse_workload

    threads = sorted(set(parse_thread_counts(args.threads)))
    if len(threads) < 2:
        raise OpBenchError(f"--threads needs at least two thread counts to show scaling, got {args.threads!r}")
    earlier = read_mlflow_records(args.best_from, args.tracking_uri) if args.best_from else []
    scalings: list[Scaling] = []
    printer = TrialPrinter(None)
    with Measurer(MeasureOptions(repeat=args.repeat)) as measurer, \
            Recorder(args.study, args.tracking_uri, extra={"engine": "threads-study"}) as recorder:
        for name in args.workloads:
            workload = parse_workload(name)
            template = get_template(workload)
            configs = {"default": template.default_config(workload)}
            if (best := best_config(earlier, workload.name)) is not None:
                configs["best"] = best
            for label, config in configs.items():
                latencies = []
                for t in threads:
                    record = measurer.measure(TrialSpec(workload, config, Resources(t), tags={"scaling_config": label}))
                    recorder(record)
                    printer(record)
                    latencies.append(record["latency_ms"] if is_ok(record) else math.nan)
                scalings.append(Scaling(workload.name, label, threads, latencies, op_features(workload)))
            mine = [s for s in scalings if s.workload == workload.name]
            plot = thread_scaling({s.config_name: (s.threads, s.latency_ms, s.efficiency) for s in mine},
                                  f"{workload.name}: thread scaling",
                                  study_dir("plots", args.study, recorder.mlflow.uri) / f"{safe_name(workload.name)}.png")
            recorder.mlflow.log_artifact(plot, "plots")
            print(f"plot: {plot}")
    print(table([(s.workload, s.config_name, *s.latency_ms, s.speedup[-1], s.efficiency[-1],
                  s.turning_point(args.threshold)) for s in scalings],
                ["workload", "config", *(f"{t}t ms" for t in threads), f"speed-up@{threads[-1]}",
                 f"eff@{threads[-1]}", f"turning point (<{args.threshold:.0%} gain)"]))
    fit = fit_turning_points(scalings, args.threshold)
    if fit:
        coefs, r2 = fit
        print("turning point ~ " + " + ".join(f"{v:.3g}*{k}" if k != "intercept" else f"{v:.3g}"
                                              for k, v in coefs.items()) + f"   (R² {r2:.3g})")
    return 0


def study_configs(names: list[str], best_from: list[str] | None, tracking_uri: str | None) -> tuple[list, list]:
    """Workloads and their configs: each one's best from the ``best_from`` studies, else its template default."""
    from opbench.space import get_template
    from opbench.studies.threads import best_config
    from opbench.tracking import read_mlflow_records
    from opbench.workloads import parse_workload

    earlier = read_mlflow_records(best_from, tracking_uri) if best_from else []
    workloads = [parse_workload(n) for n in names]
    configs = [best_config(earlier, w.name) or get_template(w).default_config(w) for w in workloads]
    return workloads, configs


def corun_layouts(texts: list[str] | None, members: int) -> list:
    """Parsed ``--layouts``, or every split of this process's cores among ``members`` plus all sharing."""
    import os

    from opbench.studies.corun import layouts_for, parse_layout

    if texts:
        return [parse_layout(t, members) for t in texts]
    return layouts_for(members, tuple(sorted(os.sched_getaffinity(0))))


def cmd_study_corun(args: argparse.Namespace) -> int:
    from opbench.measure.corun import MODES
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions
    from opbench.report.plots import slowdown_heatmaps
    from opbench.studies.corun import interference
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir

    if len(args.workloads) < 2:
        raise OpBenchError("study corun needs at least 2 workloads")
    modes = [m.strip() for m in args.modes.split(",")]
    if bad := [m for m in modes if m not in MODES]:
        raise OpBenchError(f"unknown co-run mode(s) {bad}; modes: {', '.join(MODES)}")
    workloads, configs = study_configs(args.workloads, args.best_from, args.tracking_uri)
    layouts = corun_layouts(args.layouts, 2)
    printer = TrialPrinter(None)
    with Measurer(MeasureOptions(run_timeout_s=args.run_timeout)) as measurer, \
            Recorder(args.study, args.tracking_uri, extra={"engine": "corun-study"}) as recorder:
        def log(record: dict) -> None:
            recorder(record)
            if record.get("record_kind") == "corun":
                print(corun_line(record), flush=True)
            else:
                printer(record)

        matrices = interference(measurer, workloads, configs, layouts, modes, args.window, log)
        plot = slowdown_heatmaps(matrices, "co-run slowdown (x solo latency)",
                                 study_dir("plots", args.study, recorder.mlflow.uri) / "slowdown.png")
        recorder.mlflow.log_artifact(plot, "plots")
    for label, matrix in matrices.items():
        print(f"\nslowdown, {label} (row: slowed down; column: co-runs with)")
        print(table([[name, *row] for name, row in zip(matrix.index, matrix.to_numpy())], ["", *matrix.columns]))
    print(f"\nplot: {plot}")
    return 0


def corun_options(p: argparse.ArgumentParser, window: float, study: str | None, best_from: bool = True) -> None:
    """Options of every command that co-runs workloads."""
    p.add_argument("--window", type=float, default=window, help="seconds each co-run (and solo run) lasts")
    if best_from:
        p.add_argument("--best-from", action="append", metavar="STUDY", help="configs: each workload's best there")
    p.add_argument("--run-timeout", type=float, default=60.0)
    p.add_argument("--study", default=study, help="MLflow experiment" + ("" if study else " (default from workloads)"))
    p.add_argument("--tracking-uri")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="studies across workloads and resources")
    studies = p.add_subparsers(dest="study_command", required=True)
    p = studies.add_parser("threads", help="latency, speed-up and efficiency vs threads; the turning point")
    p.add_argument("workloads", nargs="+", metavar="WORKLOAD")
    p.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2,4")
    p.add_argument("--best-from", action="append", metavar="STUDY",
                   help="take each workload's best config from these studies too; repeat")
    p.add_argument("--threshold", type=float, default=0.1, help="speed-up gain below which scaling has turned")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--study", default="threads-study", help="MLflow experiment")
    p.add_argument("--tracking-uri")
    p.set_defaults(func=cmd_study_threads)
    p = studies.add_parser("corun", help="slowdown matrix of workloads co-running in pairs, across core layouts")
    p.add_argument("workloads", nargs="+", metavar="WORKLOAD")
    p.add_argument("--layouts", nargs="+", metavar="LAYOUT",
                   help="core sets per member, e.g. '0|1' (one core each) '0,1' (both share cores 0,1); "
                        "default: every split of the available cores plus all sharing")
    p.add_argument("--modes", default="full", help="full (concurrent), stream (back to back), or full,stream")
    corun_options(p, 0.5, "corun-study")
    p.set_defaults(func=cmd_study_corun)
