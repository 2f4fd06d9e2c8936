"""A tuning study as ``opbench tune`` runs it: the engine, the references, K workers, the summary."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from opbench.engines._base import Engine
from opbench.engines.driver import CORES_KNOB, ENGINE_TRIAL_TAG, measure_references, run_tuning
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores, parse_thread_counts
from opbench.record import KNOB_PREFIX, Record, best_ok, is_ok, ok_records, speedup
from opbench.report.progress import TrialPrinter, changed_knobs, table
from opbench.studies.verify import Verification, speedup_table, verify
from opbench.workloads import Workload

ENGINES = ("optuna", "nni", "random", "grid", "model", "metaschedule")


def engine_label(args: argparse.Namespace) -> str:
    """The name a study's records carry as ``engine``: optuna-tpe, nni-anneal, random, ..."""
    if args.engine == "optuna":
        return f"optuna-{args.sampler}"
    if args.engine == "nni":
        return f"nni-{args.tuner.lower()}"
    return args.engine


def objectives(args: argparse.Namespace) -> tuple[str, ...]:
    names = tuple(o.strip() for o in args.objectives.split(",") if o.strip())
    if len(names) > 1 and args.engine != "optuna":
        raise OpBenchError(f"--objectives {args.objectives} needs --engine optuna (sampler nsga2, gp or tpe)")
    if "threads" in names and not args.search_threads:
        raise OpBenchError("--objectives with threads needs --search-threads (a thread count to trade off)")
    return names


def make_engine(args: argparse.Namespace, workload: Workload, study: str, resume: bool, seed: int | None) -> Engine:
    from opbench.engines.nni_engine import NniEngine
    from opbench.engines.optuna_engine import OptunaEngine
    from opbench.engines.simple import GridEngine, RandomEngine
    from opbench.paths import store_dir
    from opbench.space import get_template, load_search_space, search_space_path

    template = get_template(workload, args.template, args.target)
    space = load_search_space(search_space_path(template))
    if args.search_threads:
        space["threads"] = {"_type": "choice", "_value": parse_thread_counts(args.search_threads, "--search-threads")}
    if args.search_cores:
        if args.engine == "model":
            raise OpBenchError("--search-cores is not supported by --engine model (its features have no core set)")
        sets = [c.strip() for c in args.search_cores.split(";") if c.strip()]
        for core_set in sets:
            parse_cores(core_set)  # a malformed set fails here, naming it
        space[CORES_KNOB] = {"_type": "choice", "_value": sets}
    if args.engine == "optuna":
        storage = args.storage or f"sqlite:///{store_dir() / 'optuna.db'}"
        return OptunaEngine(space, args.threads, study, storage, args.sampler, seed, resume,
                            initial=template.default_config(workload), objectives=objectives(args))
    if args.engine == "nni":
        return NniEngine(args.tuner, space, args.threads, seed)
    if args.engine == "random":
        return RandomEngine(space, args.threads, seed)
    if args.engine == "model":
        from opbench.engines.model_engine import ModelEngine
        from opbench.tracking.dataset import read_dataset

        warm = read_dataset(args.warm_start) if args.warm_start else None
        return ModelEngine(space, Resources(args.threads, parse_cores(args.cores), args.target), workload, template,
                           seed, warm)
    if args.engine == "grid":
        return GridEngine(space, args.threads)
    raise OpBenchError(f"engine '{args.engine}' does not propose configs one by one; engines: {', '.join(ENGINES)}")


def recorded_engine_trials(study: str, uri: str | None, parent_run_id: str | None = None) -> dict[str, Record]:
    """Records of the study's engine trials already in MLflow, keyed by ``engine_trial``."""
    from opbench.tracking import read_mlflow_records

    try:
        rows = read_mlflow_records([study], uri, parent_run_id)
    except OpBenchError:
        return {}
    return {str(r[ENGINE_TRIAL_TAG]): r for r in rows if r.get(ENGINE_TRIAL_TAG) is not None}


def logged_engine_trials(study: str, log: str | None) -> dict[str, Record]:
    """Records of the study's engine trials in its JSON-lines log, keyed by ``engine_trial``."""
    from opbench.tracking import read_jsonl_records

    if not log or not Path(log).exists():
        return {}
    return {str(r[ENGINE_TRIAL_TAG]): r for r in read_jsonl_records(log)
            if r.get("study") == study and r.get(ENGINE_TRIAL_TAG) is not None}


def spawn_workers(argv: list[str], workers: int, todo: int, parent_run_id: str, seed: int | None) -> None:
    """Run ``todo`` trials of an already-created Optuna study in ``workers`` processes on its storage."""
    shares = [todo // workers + (i < todo % workers) for i in range(workers)]
    procs = []
    for i, share in enumerate(s for s in shares if s):
        cmd = [sys.executable, "-m", "opbench.cli", *argv, "--trials", str(share), "--workers", "1",
               "--join", parent_run_id, "--worker-index", str(i)]
        if seed is not None:
            cmd += ["--seed", str(seed + 1 + i)]  # same-seeded workers would propose the same configs
        procs.append(subprocess.Popen(cmd))
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        raise OpBenchError(f"{len(failed)} of {len(procs)} workers failed; resume the study with --resume")


def run_study(args: argparse.Namespace, argv: list[str], workload: Workload, resources: Resources) -> int:
    """The whole study: references, tuning (in-process, K workers or MetaSchedule), plot and summary."""
    from opbench.measure.measurer import Measurer
    from opbench.tracking import Recorder

    label = engine_label(args)
    study = args.study
    engine = None if args.engine == "metaschedule" else make_engine(args, workload, study, args.resume, args.seed)
    earlier = recorded_engine_trials(study, args.tracking_uri) if args.resume else {}
    # A kill between the JSON-lines log and MLflow leaves a trial's record in the log only.
    logged = {k: r for k, r in logged_engine_trials(study, args.log).items() if k not in earlier} \
        if args.resume else {}
    backfill = engine.recover({**logged, **earlier}) if hasattr(engine, "recover") else []
    backfill = [r for r in backfill if str(r[ENGINE_TRIAL_TAG]) in logged]
    earlier.update({str(r[ENGINE_TRIAL_TAG]): r for r in backfill})
    done = engine.done if engine else 0
    print(f"tuning {workload.name} with {label}: {args.trials} trials ({done} already done), "
          f"{args.threads} thread(s), {args.workers} worker(s); study '{study}'", file=sys.stderr)
    printer = TrialPrinter(args.trials)
    printer.count = done
    with Measurer(args.measure_options) as measurer, \
            Recorder(study, args.tracking_uri, args.log, extra={"engine": label}) as recorder:
        for record in backfill:
            recorder.mlflow.write(record)
        measurer.warm_up(resources)
        refs = {} if args.no_references else measure_references(measurer, workload, resources, recorder)
        sink = lambda r: (recorder(r), printer(r))
        todo = args.trials - done
        if args.engine == "metaschedule":
            records = _metaschedule(args, workload, todo, measurer, sink, resources, recorder)
        elif args.workers > 1:
            spawn_workers(argv, args.workers, todo, recorder.mlflow.parent_run_id, args.seed)
            records = list(recorded_engine_trials(study, args.tracking_uri, recorder.mlflow.parent_run_id).values())
        else:
            records = run_tuning(engine, workload, todo, measurer, sink, resources, args.template, args.batch)
        study_records = sorted([*earlier.values(), *records], key=lambda r: r.get("finished_at", 0.0))
        verification = _verify(args, measurer, [*refs.values(), *study_records], resources, recorder)
        best = summarize(study_records, refs, engine, f"{workload.name}: {label}", recorder, verification)
    if engine:
        engine.close()
    print(f"MLflow experiment '{study}' in {recorder.mlflow.uri}")
    print("open the UI: .venv/bin/opbench ui   (MLflow on 127.0.0.1:5000)")
    return 0 if best else 1


def join_study(args: argparse.Namespace, workload: Workload, resources: Resources) -> int:
    """A worker of a multi-process study: ``args.trials`` more trials of the existing Optuna study."""
    from opbench.measure.measurer import Measurer
    from opbench.tracking import Recorder

    engine = make_engine(args, workload, args.study, True, args.seed)
    printer = TrialPrinter(args.trials)
    with Measurer(args.measure_options) as measurer, \
            Recorder(args.study, args.tracking_uri, args.log, extra={"engine": engine_label(args)},
                     parent_run_id=args.join) as recorder:
        measurer.warm_up(resources)

        def sink(record: Record) -> None:
            recorder(record)
            print(f"[worker {args.worker_index}] ", end="", file=sys.stderr)
            printer(record)

        run_tuning(engine, workload, args.trials, measurer, sink, resources, args.template, args.batch)
    engine.close()
    return 0


def _verify(args: argparse.Namespace, measurer: Any, records: list[Record], resources: Resources,
            recorder: Any) -> Verification | None:
    """The best schedule and the references re-measured in fresh processes, stored on the parent run;
    None (the summary then says "not verified") when skipped, remote, or nothing succeeded."""
    if args.verify_rounds < 1 or resources.remote or \
            not any(is_ok(r) and not r.get("reference") for r in records):
        return None
    print(f"verifying: best and references in fresh processes, {args.verify_rounds} alternating rounds",
          file=sys.stderr)
    verification = verify(measurer, records, recorder.study, args.verify_rounds, recorder)
    recorder.mlflow.log_parent(metrics=verification.parent_metrics(), tags=verification.parent_tags())
    return verification


def _metaschedule(args: argparse.Namespace, workload: Workload, trials: int, measurer: Any, sink: Any,
                  resources: Resources, recorder: Any) -> list[Record]:
    from opbench.engines.metaschedule import MetaScheduleTuner
    from opbench.tracking.mlflow_store import study_dir

    work_dir = study_dir("metaschedule", args.study, args.tracking_uri)
    shutil.rmtree(work_dir, ignore_errors=True)  # a fresh search, not warm-started from an old database
    tuner = MetaScheduleTuner(work_dir, args.seed)
    records = tuner.run(workload, trials, measurer, sink, resources,
                        on_trace=lambda r, path: recorder.mlflow.log_artifact(path, "metaschedule", r["trial_id"]))
    for path in tuner.database_files():
        recorder.mlflow.log_artifact(path, "metaschedule")
    return records


def summarize(records: list[Record], refs: dict[str, Record], engine: Engine | None, title: str,
              recorder: Any, verification: Verification | None = None) -> Record | None:
    """Plot(s) as artifacts, best result on the parent run, and the tables on stdout (speed-ups from
    ``verification``, or marked "not verified")."""
    from opbench.report.plots import latency_vs_threads, tuning_curve
    from opbench.tracking.mlflow_store import study_dir

    plots = study_dir("plots", recorder.study, recorder.mlflow.uri)
    curve = tuning_curve(records, refs, title, plots / "tuning_curve.png")
    recorder.mlflow.log_artifact(curve, "plots")
    ok = ok_records(records)
    best = best_ok(ok)
    if best:
        recorder.mlflow.log_parent(
            params={"best." + k: v for k, v in best.items() if k.startswith(KNOB_PREFIX)},
            metrics={"best_latency_ms": best["latency_ms"], "best_gflops": best["gflops"],
                     **{f"tuned_speedup_vs_{n}": speedup(r, best) for n, r in refs.items()}})
    print(speedup_table(best, refs, verification))
    if best:
        print(f"\nbest config: {changed_knobs(best) or '(no knobs)'} threads={best['threads']}")
    print(f"tuning curve: {curve} (also an artifact of the study's parent run)")
    if engine is not None and len(getattr(engine, "objectives", ())) > 1:
        front_ids = engine.pareto_trial_ids()
        front = sorted((r for r in ok if r["trial_id"] in front_ids), key=lambda r: r["threads"])
        print("\nPareto front (latency vs threads):")
        print(table([(r["threads"], r["latency_ms"], r["gflops"], changed_knobs(r)) for r in front],
                    ["threads", "latency_ms", "GFLOP/s", "config"]))
        pareto = latency_vs_threads(records, front_ids, f"{title}: Pareto front", plots / "pareto_front.png")
        recorder.mlflow.log_artifact(pareto, "plots")
        print(f"Pareto plot: {pareto}")
    rejected = f"; {engine.rejected} invalid configs rejected before measuring (no trial spent)" \
        if engine is not None and engine.rejected else ""
    print(f"{len(ok)}/{len(records)} trials ok{rejected}.")
    return best
