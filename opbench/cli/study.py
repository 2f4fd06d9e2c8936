"""``opbench study threads|corun``: thread scaling of workloads' default and best configs, and the
slowdown of workloads co-running in pairs."""
from __future__ import annotations

import argparse

from opbench import settings
from opbench.argtypes import nonneg_float, positive_float, positive_int
from opbench.report.progress import TrialPrinter, corun_printer, table


def cmd_study_threads(args: argparse.Namespace) -> int:
    from opbench.hardware.resources import parse_thread_counts
    from opbench.studies.threads import ThreadStudySpec, fit_turning_points, run_thread_study

    spec = ThreadStudySpec(tuple(args.workloads), tuple(parse_thread_counts(args.threads)), args.study, args.tracking_uri,
                           tuple(args.best_from or ()), args.repeat)
    result = run_thread_study(spec, TrialPrinter(None))
    threads = result.scalings[0].threads
    for plot in result.plots:
        print(f"plot: {plot}")
    print(table([(s.workload, s.config_name, *s.latency_ms, s.speedup[-1], s.efficiency[-1],
                  s.turning_point(args.threshold)) for s in result.scalings],
                ["workload", "config", *(f"{t}t ms" for t in threads), f"speed-up@{threads[-1]}",
                 f"eff@{threads[-1]}", f"turning point (<{args.threshold:.0%} gain)"]))
    fit = fit_turning_points(result.scalings, args.threshold)
    if fit:
        coefs, r2 = fit
        print("turning point ~ " + " + ".join(f"{v:.3g}*{k}" if k != "intercept" else f"{v:.3g}"
                                              for k, v in coefs.items()) + f"   (R² {r2:.3g})")
    return 0


def cmd_study_corun(args: argparse.Namespace) -> int:
    from opbench.studies.corun import InterferenceSpec, run_interference_study

    spec = InterferenceSpec(tuple(args.workloads), tuple(args.layouts or ()), tuple(m.strip() for m in args.modes.split(",")),
                            args.window, args.study, args.tracking_uri, tuple(args.best_from or ()), args.run_timeout)
    result = run_interference_study(spec, corun_printer(None))
    for label, matrix in result.matrices.items():
        print(f"\nslowdown, {label} (row: slowed down; column: co-runs with)")
        print(table([[name, *row] for name, row in zip(matrix.index, matrix.to_numpy())], ["", *matrix.columns]))
    print(f"\nplot: {result.plot}")
    return 0


def corun_options(p: argparse.ArgumentParser, window: float, study: str | None, best_from: bool = True) -> None:
    """Options of every command that co-runs workloads."""
    p.add_argument("--window", type=positive_float, default=window, help="seconds each co-run (and solo run) lasts")
    if best_from:
        p.add_argument("--best-from", action="append", metavar="STUDY", help="configs: each workload's best there")
    p.add_argument("--run-timeout", type=positive_float, default=settings.RUN_TIMEOUT_S)
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
    p.add_argument("--threshold", type=nonneg_float, default=0.1, help="speed-up gain below which scaling has turned")
    p.add_argument("--repeat", type=positive_int, default=settings.REPEAT)
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
