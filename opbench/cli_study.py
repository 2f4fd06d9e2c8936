"""``opbench study threads``: thread-scaling studies of workloads' default and best configs."""
from __future__ import annotations

import argparse
import math

from opbench.exceptions import OpBenchError
from opbench.progress import TrialPrinter, table


def cmd_study_threads(args: argparse.Namespace) -> int:
    from opbench.features import op_features
    from opbench.measure.measurer import MeasureOptions, Measurer, TrialSpec
    from opbench.plots import thread_scaling
    from opbench.resources import Resources, parse_thread_counts
    from opbench.space import get_template
    from opbench.threads_study import Scaling, best_config, fit_turning_points
    from opbench.tracking import Recorder, read_mlflow_records
    from opbench.tracking.mlflow_store import safe_name, study_dir
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
                    latencies.append(record["latency_ms"] if record["status"] == "ok" else math.nan)
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
