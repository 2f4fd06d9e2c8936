"""``opbench tune-together`` (collaborative tuning of co-running operators) and ``opbench place``
(placement of operators on devices by Nash equilibrium)."""
from __future__ import annotations

import argparse
import itertools
import os

from opbench.exceptions import OpBenchError
from opbench.record import Record, is_ok
from opbench.report.progress import TrialPrinter, corun_line, table


def _logger(recorder, total: int | None):  # -> Callable[[Record], None]
    """Store every record; print a line per co-run and per solo tuning trial."""
    printer = TrialPrinter(total)

    def log(record: Record) -> None:
        recorder(record)
        if record.get("record_kind") == "corun":
            print(corun_line(record), flush=True)
        elif not record.get("corun_id"):
            printer(record)
    return log


def cmd_tune_together(args: argparse.Namespace) -> int:
    from opbench.cli.study import corun_layouts
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions
    from opbench.report.plots import engine_curves
    from opbench.space import get_template
    from opbench.studies.collaborative import CoTuning, compare, objective_value
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir
    from opbench.workloads import parse_workload

    if len(args.workloads) < 2:
        raise OpBenchError("tune-together needs at least 2 workloads")
    workloads = [parse_workload(w) for w in args.workloads]
    layouts = [l for l in corun_layouts(args.layouts, len(workloads)) if args.mode == "full" or l.shared]
    if not layouts:
        raise OpBenchError("a stream co-run needs a shared layout (every member on the same cores, e.g. '0,1')")
    study = args.study or "together-" + "-".join(w.name for w in workloads)
    with Measurer(MeasureOptions(build_workers=2, run_timeout_s=args.run_timeout)) as measurer, \
            Recorder(study, args.tracking_uri, extra={"engine": "tune-together"}) as recorder:
        state = study_dir("optuna", study, recorder.mlflow.uri)
        state.mkdir(parents=True, exist_ok=True)
        tuning = CoTuning(measurer, workloads, [get_template(w) for w in workloads], layouts, args.mode, args.window,
                          args.objective, _logger(recorder, args.trials))
        result = compare(tuning, args.trials, args.storage or f"sqlite:///{state / 'optuna.db'}", study,
                         args.sampler, args.seed, not args.no_baseline, tuple(sorted(os.sched_getaffinity(0))))
        rows, metrics = [], {}
        for label, best in (("independent + co-run", result.alone), ("collaborative", result.together)):
            if best is not None:
                value = objective_value(best.corun, args.objective)
                rows.append((label, best.layout.label, best.corun["makespan_ms"], best.corun["gflops_total"], value))
                metrics[f"{label.split()[0]}_objective"] = value
        metrics["gain"] = result.gain(args.objective)
        recorder.mlflow.log_parent({"objective": args.objective, "mode": args.mode}, metrics)
        curve = [{"status": r["status"], "latency_ms": objective_value(r, args.objective) if is_ok(r)
                  else None} for r in result.history]
        refs = {"independent + co-run": {"status": "ok", "latency_ms": metrics["independent_objective"]}} \
            if result.alone is not None else {}
        plot = engine_curves({"collaborative": curve}, refs, f"{args.objective}: collaborative vs independent",
                             study_dir("plots", study, recorder.mlflow.uri) / "together.png")
        recorder.mlflow.log_artifact(plot, "plots")
    unit = "ms" if args.objective == "makespan" else "ms/GFLOP"
    print("\n" + table(rows, ["approach", "layout", "makespan ms", "GFLOP/s", f"{args.objective} ({unit})"]))
    if metrics["gain"] == metrics["gain"]:
        print(f"collaborative gain: x{metrics['gain']:.3f} (independent / collaborative {args.objective})")
    print(f"plot: {plot}")
    return 0 if result.together is not None else 1


def cmd_place(args: argparse.Namespace) -> int:
    from opbench.cli.study import study_configs
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions
    from opbench.report.plots import placement_costs
    from opbench.studies import placement as game
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir

    if len(args.workloads) < 2:
        raise OpBenchError("place needs at least 2 workloads")
    workloads, configs = study_configs(args.workloads, args.best_from, args.tracking_uri)
    devices = game.parse_devices(args.devices)
    players, count = len(workloads), len(devices)
    if count ** players > args.max_profiles:
        raise OpBenchError(f"{count}^{players} = {count ** players} placements exceed --max-profiles "
                           f"{args.max_profiles}: the optimum is found by measuring them all")

    def describe(profile: tuple) -> str:
        return " ".join(f"{w.name}@{devices[d].label.removeprefix('cores ')}" for w, d in zip(workloads, profile))

    with Measurer(MeasureOptions(build_workers=2, run_timeout_s=args.run_timeout)) as measurer, \
            Recorder(args.study, args.tracking_uri, extra={"engine": "placement"}) as recorder:
        oracle = game.CostOracle(game.profile_measurer(measurer, workloads, configs, devices, args.window,
                                                       _logger(recorder, None)))
        greedy = game.greedy(oracle, players, count)
        start = greedy if args.start == "greedy" else (0,) * players
        dynamics = game.best_response_dynamics(oracle, start, count, args.eps)
        optimum, optimum_cost = game.exhaustive(oracle, players, count, args.social)
        equilibrium_cost = oracle.social(dynamics.profile, args.social)
        stable = game.is_equilibrium(oracle, dynamics.profile, count, args.eps)
        poa = game.price_of_anarchy(equilibrium_cost, optimum_cost)
        rows = [(name, describe(p), oracle.social(p, args.social), oracle.social(p, args.social) / optimum_cost,
                 *oracle.costs(p)) for name, p in (("equilibrium", dynamics.profile), ("optimum", optimum),
                                                   ("greedy", greedy))]
        recorder.mlflow.log_parent({"social": args.social, "devices": args.devices, "equilibrium": describe(
            dynamics.profile), "optimum": describe(optimum), "greedy": describe(greedy)},
            {"price_of_anarchy": poa, "greedy_ratio": oracle.social(greedy, args.social) / optimum_cost, "equilibrium_cost_ms": equilibrium_cost,
             "optimum_cost_ms": optimum_cost, "profiles_measured": oracle.measured})
        every = {describe(p): oracle.social(p, args.social)
                 for p in itertools.product(range(count), repeat=players)}
        plot = placement_costs(every, {"equilibrium": describe(dynamics.profile), "optimum": describe(optimum),
                                       "greedy": describe(greedy)},
                               f"placements by {args.social} (price of anarchy {poa:.3f})",
                               study_dir("plots", args.study, recorder.mlflow.uri) / "placement.png")
        recorder.mlflow.log_artifact(plot, "plots")
    print("\n" + table(rows, ["strategy", "placement", f"{args.social} ms", "x optimum",
                              *(f"{w.name} ms" for w in workloads)]))
    print(f"best-response dynamics from {args.start}: {len(dynamics.moves)} moves, "
          f"{'converged' if dynamics.converged else 'did NOT converge'}; "
          f"{'an' if stable else 'not an'} eps-equilibrium (eps {args.eps:.0%}); "
          f"price of anarchy {poa:.3f}; {oracle.measured} placements measured")
    print(f"plot: {plot}")
    return 0 if dynamics.converged and stable else 1


def register(sub: argparse._SubParsersAction) -> None:
    from opbench.cli.study import corun_options
    from opbench.measure.corun import MODES
    from opbench.studies.collaborative import OBJECTIVES
    from opbench.studies.placement import SOCIAL

    p = sub.add_parser("tune-together", help="tune co-running operators jointly (configs and core layout)")
    p.add_argument("workloads", nargs="+", metavar="WORKLOAD")
    p.add_argument("--objective", choices=OBJECTIVES, default="makespan")
    p.add_argument("--mode", choices=MODES, default="full", help="concurrent (full) or back to back (stream)")
    p.add_argument("--trials", type=int, default=32, help="co-run trials; each operator alone gets as many")
    p.add_argument("--layouts", nargs="+", metavar="LAYOUT", help="core layouts to choose from (see study corun)")
    p.add_argument("--sampler", default="tpe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip tuning each operator alone")
    p.add_argument("--storage", help="Optuna storage URL (default: sqlite next to the MLflow store)")
    corun_options(p, 0.3, None, best_from=False)
    p.set_defaults(func=cmd_tune_together)
    p = sub.add_parser("place", help="place operators on devices: Nash equilibrium vs optimum vs greedy")
    p.add_argument("workloads", nargs="+", metavar="WORKLOAD")
    p.add_argument("--devices", default="0;1;0,1", help="CPU core sets separated by ';' (default '0;1;0,1')")
    p.add_argument("--social", choices=SOCIAL, default="makespan", help="social cost of a placement")
    p.add_argument("--start", choices=("first", "greedy"), default="first",
                   help="best-response dynamics start: everyone on the first device, or the greedy placement")
    p.add_argument("--eps", type=float, default=0.03, help="a player moves only to gain more than this")
    p.add_argument("--max-profiles", type=int, default=81, help="refuse instances with more placements")
    corun_options(p, 0.2, "placement")
    p.set_defaults(func=cmd_place)
