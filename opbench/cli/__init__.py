"""The ``opbench`` command."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbench.argtypes import nonneg_float, nonneg_int, port, positive_float, positive_int
from opbench.cli import corun as cli_corun
from opbench.cli import data as cli_data
from opbench.cli import models as cli_models
from opbench.cli import remote as cli_remote
from opbench.cli import study as cli_study
from opbench.cli._logging import log_to_stderr
from opbench.engines.nni_engine import TUNERS
from opbench.engines.nni_experiment import EXPERIMENT_TUNERS
from opbench.engines.optuna_storage import STORAGE_ENV, STORAGE_HELP
from opbench.engines.registry import ENGINES
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores, parse_thread_counts
from opbench.lifecycle import exit_on_sigterm
from opbench.measure.host_speed import SETTLE_S, SPELL_RERUNS
from opbench.measure.types import TURNS
from opbench.plugins import load_plugins
from opbench.record import Record, is_ok, ok_records, tee
from opbench.report.progress import TrialPrinter, table
from opbench.workloads import OPERATORS, PRESETS, Workload, parse_workload
from opbench.workloads.ops import parse_value

if TYPE_CHECKING:
    from opbench.measure.types import MeasureOptions
    from opbench.studies.tune import StudyResult, TuneSpec


class UsageError(OpBenchError):
    """Malformed command-line input."""


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


def _measure_options(args: argparse.Namespace) -> MeasureOptions:
    from opbench.measure.types import MeasureOptions

    remote = {"remote_workers": args.remote_workers, "connect_timeout_s": args.connect_timeout} \
        if hasattr(args, "remote_workers") else {}
    return MeasureOptions(repeat=args.repeat, build_timeout_s=args.build_timeout,
                          run_timeout_s=args.run_timeout, max_cv=args.max_cv, max_remeasures=args.max_remeasures,
                          cache_flush=args.cache_flush, settle_s=args.settle_s,
                          spell_reruns=args.spell_reruns, turns=args.turns, **remote)


def _recorder(args: argparse.Namespace, study: str):
    from opbench.tracking import Recorder

    return Recorder(args.study or study, args.tracking_uri, args.log, extra={"engine": args.command})


def _print_records(records: list[Record], as_json: bool) -> None:
    if as_json:
        out = records[0] if len(records) == 1 else records
        print(json.dumps(out, default=str, allow_nan=True, indent=None))


def cmd_ops(args: argparse.Namespace) -> int:
    print(table([(op.name, ",".join(op.keys), ",".join(f"{k}={v}" for k, v in op.options.items()), op.description)
                 for op in OPERATORS.values()], ["operator", "keys", "options (default)", "computes"]))
    print()
    print(table([(name, p.spec, p.model or "-", p.layer) for name, p in PRESETS.items()],
                ["preset", "workload", "model", "layer"]))
    return 0


def cmd_space(args: argparse.Namespace) -> int:
    from opbench.space import get_template

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


def _resources(args: argparse.Namespace, threads: int) -> Resources:
    return Resources(threads=threads, cores=parse_cores(args.cores), target=args.target,
                     device=cli_remote.device_of(args))


def cmd_measure(args: argparse.Namespace) -> int:
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import TrialSpec

    workload = parse_workload(args.workload)
    spec = TrialSpec(workload, _config(args), _resources(args, args.threads), args.template)
    with Measurer(_measure_options(args)) as measurer, _recorder(args, "measure") as recorder:
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
    specs = [TrialSpec(workload, {**base, **point}, _resources(args, t), args.template)
             for t in threads for point in points]
    printer = TrialPrinter(len(specs))
    with Measurer(_measure_options(args)) as measurer, _recorder(args, f"sweep-{workload.name}") as recorder:
        for t in threads:
            measurer.warm_up(_resources(args, t))
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
    print(f"\n{len(ok)} ok, {failed} failed; MLflow experiment '{recorder.study}' ({recorder.mlflow.uri})")
    return 0


def tune_spec(args: argparse.Namespace) -> TuneSpec:
    """The study ``opbench tune`` asks for; the specs check the combination (their errors name the flag)."""
    from opbench.engines.registry import EngineSpec
    from opbench.studies.tune import TuneSpec

    resources = _resources(args, args.threads)
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
        args.batch, args.workers, args.resume, not args.no_references, args.verify_rounds, _measure_options(args),
        args.tracking_uri, args.log)


def cmd_tune(args: argparse.Namespace) -> int:
    from opbench.studies.tune import run_study

    spec = tune_spec(args)
    result = run_study(spec, on_record=TrialPrinter(spec.trials))
    print_study(result)
    print(f"MLflow experiment '{result.study}' in {result.tracking_uri}")
    print("open the UI: .venv/bin/opbench ui   (MLflow on 127.0.0.1:5000)")
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
    from opbench.studies.verify import speedup_table

    best = result.best
    print(speedup_table(best, result.references, result.verification))
    if best:
        print(f"\nbest config: {changed_knobs(best) or '(no knobs)'} threads={best['threads']}")
    print(f"tuning curve: {result.plots['tuning_curve']} (also an artifact of the study's parent run)")
    if "pareto_front" in result.plots:
        print("\nPareto front (latency vs threads):")
        print(table([(r["threads"], r["latency_ms"], r["gflops"], changed_knobs(r)) for r in result.pareto],
                    ["threads", "latency_ms", "GFLOP/s", "config"]))
        print(f"Pareto plot: {result.plots['pareto_front']}")
    print(f"{len(ok_records(result.records))}/{len(result.records)} trials ok; "
          f"{result.rejected} invalid configs rejected before measuring (built-in spaces: always 0).")


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
    from opbench.engines.nni_experiment import ExperimentSpec, write_experiment

    spec = ExperimentSpec(args.workload, args.tuner, args.trials, args.concurrency, args.threads,
                          parse_thread_counts(args.search_threads, "--search-threads") if args.search_threads else None,
                          args.study, args.seed, args.repeat, args.template, _knobs(args.knobs), args.warm_start,
                          args.target, args.device)
    path = write_experiment(spec, Path(args.out))
    print(f"wrote {path} (+ search_space.json, README.md)\nrun it: nnictl create --config {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from opbench.report.summary import summary_table, write_report
    from opbench.tracking import Recorder, read_mlflow_records
    from opbench.tracking.mlflow_store import KIND_TAG, study_dir

    records = read_mlflow_records(args.studies, args.tracking_uri)
    out = Path(args.out) if args.out else study_dir("reports", "+".join(args.studies), args.tracking_uri)
    title = ", ".join(sorted({r.get("workload", "?") for r in records}))
    summaries, paths = write_report(records, title, out)
    print(summary_table(summaries))
    with Recorder(args.studies[0], args.tracking_uri, parent_tags={KIND_TAG: "report", "mlflow.runName": "report"}) \
            as recorder:
        for path in paths:
            recorder.mlflow.log_artifact(path, "report")
    print("\n" + "\n".join(f"wrote {p}" for p in paths))
    print(f"(also artifacts of the 'report' run in MLflow experiment '{args.studies[0]}')")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from opbench.measure.measurer import Measurer
    from opbench.studies.verify import contenders_of, references, speedup_table, verified_best, verify
    from opbench.tracking import Recorder, read_mlflow_records
    from opbench.tracking.mlflow_store import latest_parent_run

    parent = args.run or latest_parent_run(args.study, args.tracking_uri)
    with Measurer(_measure_options(args)) as measurer, \
            Recorder(args.study, args.tracking_uri, args.log, parent_run_id=parent) as recorder:
        records = read_mlflow_records([args.study], args.tracking_uri, parent)  # after the write-ahead log's replay
        if not records:
            raise OpBenchError(f"run {parent} of MLflow experiment '{args.study}' has no trials to verify")
        refs = references(records)
        print(f"verifying '{args.study}' run {parent}: the fastest of its {len(contenders_of(records))} contenders (its "
              f"best configs and its default, timed in fresh processes), then it and {', '.join(refs) or 'no reference'} "
              f"in fresh processes, {args.rounds} alternating rounds", file=sys.stderr)
        verification = verify(measurer, records, args.study, args.rounds, recorder)
        recorder.mlflow.log_parent(metrics=verification.parent_metrics(), tags=verification.parent_tags())
    print(speedup_table(verified_best(records, verification), refs, verification))
    print(f"recorded on run {parent} of MLflow experiment '{args.study}' ({recorder.mlflow.uri})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    argv = ["tune", "matmul-512", "--engine", "optuna", "--sampler", "tpe", "--trials", str(args.trials),
            "--threads", str(args.threads), "--study", "demo-matmul-512", "--seed", "0", "--batch", "2"]
    return main(argv)


def cmd_ui(args: argparse.Namespace) -> int:
    import subprocess

    from opbench.tracking.mlflow_store import default_tracking_uri, ensure_store

    uri = args.tracking_uri or default_tracking_uri()
    ensure_store(uri)
    print(f"MLflow UI on http://127.0.0.1:{args.port} for {uri} (Ctrl-C stops it)", file=sys.stderr)
    return subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                            "--host", "127.0.0.1", "--port", str(args.port)])


def _add_measure_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="OP:key=value,... or a preset (see `opbench ops`)")
    p.add_argument("--config", help="knob values as a JSON object")
    p.add_argument("--config-file", help="file holding the config JSON")
    p.add_argument("--template", help="schedule template (default: the op's own; convolutions on CPUs: the packed "
                                      "*_nchwc; te_default = unscheduled)")
    p.add_argument("--cores", help="pin to these cores, e.g. 0,1 or 0-3")
    p.add_argument("--target", default="llvm",
                   help="llvm (host CPU), cuda, 'cuda -arch=sm_XX', or a board preset (see `opbench targets`)")
    _add_timing_flags(p)
    p.add_argument("--study", help="MLflow experiment name")
    p.add_argument("--json", action="store_true", help="print the record(s) as JSON")
    cli_remote.add_device_flags(p)


def _add_timing_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=positive_int, default=5, help="timed repeats (each >= 50 ms)")
    p.add_argument("--max-cv", type=positive_float, default=0.05,
                   help="repeats varying more than this (std/mean) are measured again (see --max-remeasures)")
    p.add_argument("--max-remeasures", type=nonneg_int, default=2, help="extra attempts for a noisy result; the steadiest kept")
    p.add_argument("--cache-flush", action="store_true", help="evict the CPU caches before every timed call")
    p.add_argument("--settle-s", type=nonneg_float, default=SETTLE_S,
                   help="a trial waits up to this long for the host's usual speed (its probe within 10%%; 0: only "
                        "record host_slowness; default: $OPBENCH_SETTLE_S or 0)")
    p.add_argument("--spell-reruns", type=nonneg_int, default=SPELL_RERUNS,
                   help="a run of at most 1 s that the host-speed probes before or after it found outside the "
                        "host's usual state is taken again at most this many times (default: $OPBENCH_SPELL_RERUNS or 1)")
    p.add_argument("--turns", type=positive_int, default=TURNS,
                   help="the trials of a batch (--batch, or several configs) take their repeats in this many turns, "
                        "interleaved with each other's, so that a spell of the host falls on all alike (default 3)")
    p.add_argument("--build-timeout", type=positive_float, default=60.0)
    p.add_argument("--run-timeout", type=positive_float, default=120.0)
    p.add_argument("--log", help="also append records to this JSON-lines file")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite store in mlflow/)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opbench", description="Benchmark and tune DL operators with TVM.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops", help="list operators and presets").set_defaults(func=cmd_ops)
    p = sub.add_parser("space", help="show the knobs of a workload's template")
    p.add_argument("workload")
    p.add_argument("--template")
    p.add_argument("--target", default="llvm", help="cuda picks the op's CUDA template")
    p.add_argument("--json", action="store_true", help="print the NNI-format search space")
    p.set_defaults(func=cmd_space)
    p = sub.add_parser("measure", help="measure one trial")
    _add_measure_flags(p)
    p.add_argument("--threads", type=positive_int, default=1)
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("sweep", help="measure a grid of configs")
    _add_measure_flags(p)
    p.add_argument("--grid", nargs="*", metavar="KNOB=V1,V2", help="knob values to cross")
    p.add_argument("--threads", default="1", help="comma-separated thread counts to cross")
    p.add_argument("--top", type=positive_int, default=10, help="rows in the summary table")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("tune", help="tune a workload with an engine (Optuna, NNI, random, grid, MetaSchedule)")
    _add_measure_flags(p)
    p.add_argument("--engine", default="optuna", choices=ENGINES,
                   help="who proposes configs: Optuna, an NNI tuner in-process, random, grid, or TVM's MetaSchedule")
    p.add_argument("--sampler", default="tpe", help="Optuna sampler: tpe, random, cmaes, gp, nsga2, grid")
    p.add_argument("--tuner", default="TPE", choices=TUNERS, help="NNI tuner for --engine nni")
    p.add_argument("--warm-start", metavar="DATASET", help="--engine model: train the first model on these logs")
    p.add_argument("--objectives", default="latency",
                   help="Optuna objectives to minimise: latency, or latency,threads or latency,energy (joules per call) for a Pareto front")
    p.add_argument("--workers", type=positive_int, default=1, help="Optuna worker processes sharing the study's storage")
    p.add_argument("--trials", type=nonneg_int, default=64)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--search-threads", metavar="LIST", help="also search the thread count among these, e.g. 1,2")
    p.add_argument("--search-cores", metavar="SETS", help="also search the core set among these, e.g. '0;1;0,1'")
    p.add_argument("--batch", type=positive_int, default=1, help="configs proposed, built in parallel, then timed, per step")
    p.add_argument("--seed", type=int)
    p.add_argument("--storage", default=os.environ.get(STORAGE_ENV), help=STORAGE_HELP)
    p.add_argument("--resume", action="store_true", help="continue the study instead of starting it afresh")
    p.add_argument("--no-references", action="store_true", help="skip TE-default/torch/numpy reference timings")
    p.add_argument("--verify-rounds", type=nonneg_int, default=3, metavar="N",
                   help="re-measure the best and the references in fresh processes, N alternating rounds "
                        "(0: skip; speed-ups are then printed as not verified)")
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
    _add_timing_flags(p)
    p.set_defaults(func=cmd_verify)
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
    p.add_argument("--repeat", type=positive_int, default=5)
    p.add_argument("--knobs", nargs="*", metavar="KNOB[=V1,V2]",
                   help="search only these knobs (others take the default), optionally only these values")
    p.add_argument("--target", default="llvm", help="as for measure: llvm, cuda, or a board preset")
    p.add_argument("--device", default="local", help="local or rpc://HOST:PORT/KEY (trials run on the key's devices)")
    p.add_argument("--out", required=True, help="the experiment folder, e.g. experiments/matmul-512-tpe")
    p.set_defaults(func=cmd_nni_new)
    p = sub.add_parser("report", help="tuning curves, latency vs threads, best TIR and a table of a study")
    p.add_argument("studies", nargs="+", metavar="STUDY", help="MLflow experiment(s) to report on together")
    p.add_argument("--tracking-uri")
    p.add_argument("--out", help="folder for the PNGs and TIR (default mlflow/reports/<study>)")
    p.set_defaults(func=cmd_report)
    cli_data.register(sub)
    cli_study.register(sub)
    cli_corun.register(sub)
    cli_models.register(sub)
    cli_remote.register(sub)
    p = sub.add_parser("demo", help="the main job: an Optuna TPE study on matmul-512")
    p.add_argument("--trials", type=nonneg_int, default=60)
    p.add_argument("--threads", type=positive_int, default=min(2, len(os.sched_getaffinity(0))))
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("ui", help="start the MLflow UI on the store, bound to 127.0.0.1")
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


