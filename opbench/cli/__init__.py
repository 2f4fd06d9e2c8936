"""The ``opbench`` command."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from opbench import settings
from opbench.argtypes import nonneg_int, port, positive_int
from opbench.cli import corun as cli_corun
from opbench.cli import data as cli_data
from opbench.cli import models as cli_models
from opbench.cli import remote as cli_remote
from opbench.cli import study as cli_study
from opbench.cli import tuning as cli_tuning
from opbench.cli._common import Parser, UsageError, add_measure_flags, measure_options, resources_of
from opbench.cli._logging import log_to_stderr
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import parse_thread_counts
from opbench.integration.nni.experiment import EXPERIMENT_TUNERS
from opbench.lifecycle import exit_on_sigterm, skip_final_collection
from opbench.plugins import load_plugins
from opbench.record import TrialRecord, is_ok, tee
from opbench.report.progress import TrialPrinter, table
from opbench.urls import masked
from opbench.workloads import OPERATORS, PRESETS, Workload, parse_workload
from opbench.workloads.ops import parse_value


def _config(args: argparse.Namespace) -> dict[str, Any]:
    text = args.config
    if args.config_file:
        try:
            text = Path(args.config_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read config file {args.config_file}: {exc.strerror}") from exc
    if not text:
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"malformed config JSON ({exc.msg} at column {exc.colno}): {text!r}") from exc
    if not isinstance(config, dict):
        raise UsageError(f"config must be a JSON object of knob values, got {type(config).__name__}")
    return config


def _grid(items: list[str]) -> list[dict[str, Any]]:
    axes = []
    for item in items:
        knob, eq, values = item.partition("=")
        if not eq or not knob or not values:
            raise UsageError(f"malformed --grid item {item!r}: expected knob=v1,v2,...")
        axes.append([(knob, parse_value(v)) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def _recorder(args: argparse.Namespace, study: str):
    from opbench.tracking import Recorder

    return Recorder(args.study or study, args.tracking_uri, args.log, extra={"engine": args.command})


def _print_records(records: list[TrialRecord], as_json: bool) -> None:
    if as_json:
        rows = [r.to_row() for r in records]
        print(json.dumps(rows[0] if len(rows) == 1 else rows, default=str, allow_nan=True, indent=None))


def cmd_ops(args: argparse.Namespace) -> int:
    print(table([(op.name, ",".join(op.keys), ",".join(f"{k}={v}" for k, v in op.options.items()), op.description)
                 for op in OPERATORS.values()], ["operator", "keys", "options (default)", "computes"]))
    print()
    print(table([(name, p.spec, p.model or "-", p.layer) for name, p in PRESETS.items()],
                ["preset", "workload", "model", "layer"]))
    return 0


def cmd_space(args: argparse.Namespace) -> int:
    from opbench.space import get_template

    if args.all:
        from opbench.space.catalogue import write_spaces

        paths = write_spaces(Path(args.out))
        print(f"wrote {len(paths)} search spaces (every preset under every template that applies) to {args.out}/")
        return 0
    if args.workload is None:
        raise UsageError("name a workload, or give --all")
    workload = parse_workload(args.workload)
    template = get_template(workload, args.template, args.target)
    default = template.default_config(workload)
    if args.json:
        print(json.dumps(template.search_space(workload), indent=2))
        return 0
    print(f"{workload.name}: template '{template.name}', axes "
          + " ".join(f"{a.name}={a.extent}{'(r)' if a.reduce else ''}" for a in workload.axes))
    print(table([(k.name, _choices(k.choices), default.get(k.name), k.help) for k in template.knobs(workload)],
                ["knob", "choices", "default", "meaning"]))
    return 0


def _choices(values: tuple, shown: int = 10) -> str:
    """A knob's choices, the long lists of splits cut to their first and last few (``--json`` has all)."""
    if len(values) <= shown:
        return ",".join(map(str, values))
    return f"{len(values)}: " + ",".join(map(str, values[:shown - 3])) + ",...," + ",".join(map(str, values[-2:]))


def cmd_measure(args: argparse.Namespace) -> int:
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import TrialSpec

    workload = parse_workload(args.workload)
    spec = TrialSpec(workload, _config(args), resources_of(args, args.threads), args.template)
    with Measurer(measure_options(args)) as measurer, _recorder(args, "measure") as recorder:
        if spec.resources.remote:  # an unreachable tracker or an unknown key is bad input, not a trial
            measurer.warm_up(spec.resources)
        record = measurer.measure(spec)  # an invalid config is recorded without starting any worker
        recorder(record)
    if args.json:
        _print_records([record], True)
    else:
        TrialPrinter(None, sys.stdout)(record)
    return 0 if is_ok(record) else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import TrialSpec
    from opbench.space import get_template

    workload: Workload = parse_workload(args.workload)
    base = _config(args)
    threads = parse_thread_counts(args.threads)
    points = _grid(args.grid or [])
    knobs = {k.name for k in get_template(workload, args.template, args.target).knobs(workload)}
    unknown = sorted({g.partition("=")[0] for g in args.grid or []} - knobs)
    if unknown:  # a typo would make every trial invalid_config: nothing runs
        raise UsageError(f"--grid: unknown knob(s) {', '.join(unknown)} for {workload.name} (knobs: {', '.join(sorted(knobs))})")
    specs = [TrialSpec(workload, {**base, **point}, resources_of(args, t), args.template)
             for t in threads for point in points]
    printer = TrialPrinter(len(specs))
    with Measurer(measure_options(args)) as measurer, _recorder(args, f"sweep-{workload.name}") as recorder:
        for t in threads:
            measurer.warm_up(resources_of(args, t))
        for spec in specs:
            measurer.measure_batch([spec], on_record=tee(recorder, printer))
        records = recorder.records
    if args.json:
        _print_records(records, True)
        return 0
    ok = sorted((r for r in records if is_ok(r)), key=lambda r: r["latency_ms"])
    print(table([(r["latency_ms"], r["gflops"], r["threads"], " ".join(f"{k[5:]}={v}" for k, v in r.items()
                  if k.startswith("knob.") and k[5:] in {g.partition('=')[0] for g in args.grid or []}))
                 for r in ok[: args.top]], ["latency_ms", "GFLOP/s", "threads", "grid point"]))
    failed = len(records) - len(ok)
    print(f"\n{len(ok)} ok, {failed} failed; MLflow experiment '{recorder.study}' ({masked(recorder.uri)})")
    return 0


def _knobs(items: list[str] | None) -> dict[str, list[Any] | None] | None:
    if not items:
        return None
    out: dict[str, list[Any] | None] = {}
    for item in items:
        knob, eq, values = item.partition("=")
        if not knob or (eq and not values):
            raise UsageError(f"malformed --knobs item {item!r}: expected knob or knob=v1,v2,...")
        out[knob] = [parse_value(v) for v in values.split(",")] if eq else None
    return out


def cmd_nni_new(args: argparse.Namespace) -> int:
    from opbench.integration.nni.experiment import ExperimentSpec, write_experiment

    spec = ExperimentSpec(args.workload, args.tuner, args.trials, args.concurrency, args.threads,
                          parse_thread_counts(args.search_threads, "--search-threads") if args.search_threads else None,
                          args.study, args.seed, args.repeat, args.template, _knobs(args.knobs), args.warm_start,
                          args.target, args.device)
    path = write_experiment(spec, Path(args.out))
    print(f"wrote {path} (+ search_space.json, README.md)\nrun it: nnictl create --config {path}")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from opbench.tracking import default_tracking_uri, runs_url, serve_ui, ui_address

    uri = args.tracking_uri or default_tracking_uri()
    where = runs_url(args.study, uri, args.port) if args.study else ui_address(args.port)
    print(f"MLflow UI for {masked(uri)}: {where} (Ctrl-C stops it)", file=sys.stderr)
    return serve_ui(uri, args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="opbench", description="Benchmark and tune DL operators with TVM.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops", help="list operators and presets").set_defaults(func=cmd_ops)
    p = sub.add_parser("space", help="show the knobs of a workload's template")
    p.add_argument("workload", nargs="?")
    p.add_argument("--all", action="store_true",
                   help="write the NNI space of every preset under every template that applies (to --out)")
    p.add_argument("--out", default="search_spaces", help="the folder --all writes (default search_spaces)")
    p.add_argument("--template")
    p.add_argument("--target", default="llvm", help="cuda picks the op's CUDA template")
    p.add_argument("--json", action="store_true", help="print the NNI-format search space")
    p.set_defaults(func=cmd_space)
    p = sub.add_parser("measure", help="measure one trial")
    add_measure_flags(p)
    p.add_argument("--threads", type=positive_int, default=1)
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("sweep", help="measure a grid of configs")
    add_measure_flags(p)
    p.add_argument("--grid", nargs="*", metavar="KNOB=V1,V2", help="knob values to cross")
    p.add_argument("--threads", default="1", help="comma-separated thread counts to cross")
    p.add_argument("--top", type=positive_int, default=10, help="rows in the summary table")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("nni", help="NNI experiments")
    nni = p.add_subparsers(dest="nni_command", required=True)
    p = nni.add_parser("new", help="write a ready NNI experiment (config.yml, search_space.json, README.md)")
    p.add_argument("workload")
    p.add_argument("--tuner", default="TPE", choices=EXPERIMENT_TUNERS,
                   help="an NNI built-in tuner, or Model: OpBench's model engine as a custom tuner class")
    p.add_argument("--warm-start", metavar="DATASET", help="--tuner Model: train its first predictor on these logs")
    p.add_argument("--trials", type=nonneg_int, default=64)
    p.add_argument("--concurrency", type=positive_int, default=1, help="trials NNI runs at once (timings take turns)")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--search-threads", metavar="LIST", help="also search the thread count among these")
    p.add_argument("--template")
    p.add_argument("--study", help="MLflow experiment (default nni-<folder name>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=positive_int, default=settings.REPEAT)
    p.add_argument("--knobs", nargs="*", metavar="KNOB[=V1,V2]",
                   help="search only these knobs (others take the default), optionally only these values")
    p.add_argument("--target", default="llvm", help="as for measure: llvm, cuda, or a board preset")
    p.add_argument("--device", default="local", help="local or rpc://HOST:PORT/KEY (trials run on the key's devices)")
    p.add_argument("--out", required=True, help="the experiment folder, e.g. experiments/matmul-512-tpe")
    p.set_defaults(func=cmd_nni_new)
    cli_tuning.register(sub)
    cli_data.register(sub)
    cli_study.register(sub)
    cli_corun.register(sub)
    cli_models.register(sub)
    cli_remote.register(sub)
    p = sub.add_parser("ui", help="start the MLflow UI on the store, bound to 127.0.0.1")
    p.add_argument("study", nargs="?", help="print the address of this study's runs (MLflow opens its GenAI overview otherwise)")
    p.add_argument("--tracking-uri")
    p.add_argument("--port", type=port, default=5000)
    p.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()
    if argv is None:  # the command itself, not a call from Python (which keeps its own signal handling)
        exit_on_sigterm()
    try:
        load_plugins()
        return args.func(args)
    except OpBenchError as exc:
        print(f"opbench {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if argv is None:
            skip_final_collection()


