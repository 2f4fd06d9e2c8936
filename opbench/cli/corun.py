"""``opbench tune-together`` (collaborative tuning of co-running operators) and ``opbench place``
(placement of operators on devices by Nash equilibrium)."""
from __future__ import annotations

import argparse

from opbench.argtypes import nonneg_float, nonneg_int, positive_int
from opbench.engines.optuna.storage import STORAGE_HELP
from opbench.report.progress import corun_printer, table


def cmd_tune_together(args: argparse.Namespace) -> int:
    from opbench.studies.collaborative import TogetherSpec, tune_together

    spec = TogetherSpec(tuple(args.workloads), args.trials, tuple(args.layouts or ()), args.mode, args.window,
                        args.objective, args.study, args.storage, args.sampler, args.seed, not args.no_baseline,
                        args.tracking_uri, args.run_timeout)
    result = tune_together(spec, corun_printer(args.trials))
    unit = "ms" if args.objective == "makespan" else "ms/GFLOP"
    print("\n" + table(result.rows, ["approach", "layout", "makespan ms", "GFLOP/s", f"{args.objective} ({unit})"]))
    if result.metrics["gain"] == result.metrics["gain"]:
        print(f"collaborative gain: x{result.metrics['gain']:.3f} (independent / collaborative {args.objective})")
    print(f"plot: {result.plot}")
    return 0 if result.comparison.together is not None else 1


def cmd_place(args: argparse.Namespace) -> int:
    from opbench.studies.placement import PlacementSpec, place

    spec = PlacementSpec(tuple(args.workloads), args.devices, args.social, args.start, args.eps, args.max_profiles,
                         args.window, args.study, args.tracking_uri, tuple(args.best_from or ()), args.run_timeout)
    result = place(spec, corun_printer(None))
    print("\n" + table(result.rows, ["strategy", "placement", f"{args.social} ms", "x optimum",
                                     *(f"{name} ms" for name in result.names)]))
    converged = result.dynamics.converged
    print(f"best-response dynamics from {args.start}: {len(result.dynamics.moves)} moves, "
          f"{'converged' if converged else 'did NOT converge'}; "
          f"{'an' if result.stable else 'not an'} eps-equilibrium (eps {args.eps:.0%}); "
          f"price of anarchy {result.price_of_anarchy:.3f}; {result.measured} placements measured")
    print(f"plot: {result.plot}")
    return 0 if converged and result.stable else 1


def register(sub: argparse._SubParsersAction) -> None:
    from opbench.cli.study import corun_options
    from opbench.measure.corun import MODES
    from opbench.studies.collaborative import OBJECTIVES
    from opbench.studies.placement import SOCIAL

    p = sub.add_parser("tune-together", help="tune co-running operators jointly (configs and core layout)")
    p.add_argument("workloads", nargs="+", metavar="WORKLOAD")
    p.add_argument("--objective", choices=OBJECTIVES, default="makespan")
    p.add_argument("--mode", choices=MODES, default="full", help="concurrent (full) or back to back (stream)")
    p.add_argument("--trials", type=nonneg_int, default=32, help="co-run trials; each operator alone gets as many")
    p.add_argument("--layouts", nargs="+", metavar="LAYOUT", help="core layouts to choose from (see study corun)")
    p.add_argument("--sampler", default="tpe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip tuning each operator alone")
    p.add_argument("--storage", help=STORAGE_HELP)
    corun_options(p, 0.3, None, best_from=False)
    p.set_defaults(func=cmd_tune_together)
    p = sub.add_parser("place", help="place operators on devices: Nash equilibrium vs optimum vs greedy")
    p.add_argument("workloads", nargs="+", metavar="WORKLOAD")
    p.add_argument("--devices", default="0;1;0,1", help="CPU core sets separated by ';' (default '0;1;0,1')")
    p.add_argument("--social", choices=SOCIAL, default="makespan", help="social cost of a placement")
    p.add_argument("--start", choices=("first", "greedy"), default="first",
                   help="best-response dynamics start: everyone on the first device, or the greedy placement")
    p.add_argument("--eps", type=nonneg_float, default=0.03, help="a player moves only to gain more than this")
    p.add_argument("--max-profiles", type=positive_int, default=81, help="refuse instances with more placements")
    corun_options(p, 0.2, "placement")
    p.set_defaults(func=cmd_place)
