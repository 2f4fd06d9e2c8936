"""``opbench models``, ``opbench model-ops`` (the operators that take a model's time) and
``opbench tune-model`` (tune the key ones, build the model with them, compare with PyTorch)."""
from __future__ import annotations

import argparse
import math

from opbench.exceptions import OpBenchError
from opbench.record import is_ok
from opbench.report.progress import TrialPrinter, table


def cmd_models(args: argparse.Namespace) -> int:
    from opbench.workloads.models.hf import HF_MODELS
    from opbench.workloads.models.sources import TINY, TORCH_MODELS

    rows = [(name, "torch", f"{name}{TINY}") for name in TORCH_MODELS]
    rows += [(name, "transformers", f"{name}{TINY}") for name in HF_MODELS]
    rows.append(("simple:WORKLOAD", "one catalogue workload, e.g. simple:matmul-512", "-"))
    rows.append(("PATH.onnx", "onnx", "-"))
    print(table(rows, ["model", "source", "tiny variant"]))
    return 0


def _profile(args: argparse.Namespace):  # -> ModelProfile
    """Profile ``args.model`` with ``args.threads`` threads, a line per operator, and cache its operators."""
    import tvm

    from opbench.hardware.targets import make_target
    from opbench.models import cache
    from opbench.studies.models.profile import profile_model
    from opbench.workloads.models.sources import load_model

    source = load_model(args.model, args.batch, args.seq_len)
    tvm.get_global_func("runtime.config_threadpool")(-3, args.threads, [])
    print(f"{source.name}: importing, fusing and timing each fused operator ({args.threads} threads)", flush=True)
    profile = profile_model(source, make_target("llvm", args.threads), args.threads, args.repeat, args.batch,
                            args.seq_len, lambda n, op: print(f"[{n}] {op.name:<40s} {op.latency_ms:9.4f} ms x {op.calls}",
                                                flush=True))
    cache.save(args.model, args.batch, args.seq_len, profile.ops, profile.funcs)
    return profile


def cmd_model_ops(args: argparse.Namespace) -> int:
    from opbench.studies.models.profile import reference_name
    from opbench.tracking import Recorder
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.sources import SIMPLE_PREFIX

    profile = _profile(args)
    ops = sorted(profile.ops, key=lambda o: -o.share)
    rows = [("*" if o.key else "", o.name, o.kind, " ".join("x".join(map(str, s)) for s in o.shapes), o.calls,
             o.flops / 1e6, o.latency_ms, o.share) for o in ops]
    print(table(rows, ["key", "function", "kind", "shapes", "calls", "MFLOP", "ms/call", "share"]))
    print(f"sum of operators {profile.ops_ms:.3f} ms; whole model on the Relax VM {profile.model_ms:.3f} ms "
          f"(ops / model = {profile.ops_ms / profile.model_ms:.2f}); PyTorch eager {profile.torch_ms:.3f} ms; "
          f"output matches {reference_name(profile.source)} (max |err| {profile.max_abs_err:.2g}); "
          "key operators (*) cover >= 90% of operator time")
    key = next((o for o in ops if o.key and o.outputs == 1), None)
    if profile.source.kind == "simple":  # a catalogue workload: tune it with its own template
        print(f"tune it: opbench tune '{args.model.removeprefix(SIMPLE_PREFIX)}' --trials 32")
    elif key is not None:
        print(f"tune one: opbench tune '{model_name(args.model, key.name, args.batch, args.seq_len)}' --trials 32")
    with Recorder(args.study, args.tracking_uri, extra={"engine": "model-ops"},
                  parent_tags={"model": args.model}) as recorder:
        for op in ops:
            recorder({"workload": model_name(args.model, op.name, args.batch, args.seq_len), "op": op.kind,
                      "dtype": op.dtype, "shape": ";".join("x".join(map(str, s)) for s in op.shapes),
                      "source_model": args.model, "threads": args.threads, "status": "ok",
                      "latency_ms": op.latency_ms, "calls": op.calls, "share": op.share, "key_op": op.key,
                      "flops": op.flops, "gflops": op.flops / (op.latency_ms * 1e-3) / 1e9})
        recorder.mlflow.log_parent({"model": args.model, "batch": args.batch, "seq_len": args.seq_len,
                                    "threads": args.threads},
                                   {"model_ms": profile.model_ms, "ops_sum_ms": profile.ops_ms,
                                    "torch_ms": profile.torch_ms, "max_abs_err": profile.max_abs_err,
                                    "fused_ops": len(ops)})
    return 0


def tune_model(args: argparse.Namespace) -> dict:
    """Profile the model, tune its key operators, build it with them: per-op rows and model metrics."""
    from opbench.engines.driver import run_tuning
    from opbench.engines.simple import GridEngine
    from opbench.hardware.resources import Resources
    from opbench.hardware.targets import make_target
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions
    from opbench.space import get_template
    from opbench.studies.models.profile import check_outputs
    from opbench.studies.models.tuned import TunedOp, apply_database, write_database
    from opbench.studies.threads import best_config
    from opbench.studies.tune import make_engine
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir
    from opbench.workloads import parse_workload
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.extract import time_model

    if args.trials_per_op < 1:
        raise OpBenchError(f"--trials-per-op must be >= 1, got {args.trials_per_op}")
    profile = _profile(args)
    tunable = [o for o in sorted(profile.ops, key=lambda o: -o.share) if o.outputs == 1]
    key = {o.name for o in [o for o in tunable if o.key][:args.max_ops]}
    study = args.study or f"tune-model-{args.model}"
    target = make_target("llvm", args.threads)
    tuned: list[TunedOp] = []
    rows = []
    with Measurer(MeasureOptions(repeat=args.repeat)) as measurer, \
            Recorder(study, args.tracking_uri, extra={"engine": args.engine}, parent_tags={"model": args.model}) \
            as recorder:
        for op in tunable:  # key operators are tuned; the others get the template's default schedule (1 trial)
            workload = parse_workload(model_name(args.model, op.name, args.batch, args.seq_len))
            trials = args.trials_per_op if op.name in key else 1
            print(f"--- {workload.name}: {op.share:.1%} of the model, "
                  + (f"{trials} trials" if op.name in key else "default schedule"), flush=True)
            default = get_template(workload).default_config(workload)
            engine = make_engine(args, workload, f"{study}-{op.name}", False, args.seed) if op.name in key \
                else GridEngine({k: {"_type": "choice", "_value": [v]} for k, v in default.items()}, args.threads)
            printer = TrialPrinter(trials)
            records = run_tuning(engine, workload, trials, measurer, lambda r, p=printer: (recorder(r), p(r)),
                                 Resources(args.threads))
            engine.close()
            config = best_config(records, workload.name)
            best = min((r["latency_ms"] for r in records if is_ok(r)), default=math.inf)
            if config is None or best >= op.latency_ms:
                print(f"    nothing faster than TVM's default lowering for {op.name}: it keeps that", flush=True)
                continue
            template = get_template(workload)
            tuned.append(TunedOp(workload, template, template.validate(config, workload), best))
            rows.append((op.name, op.kind, op.share, op.latency_ms, best, op.latency_ms / best,
                         "tuned" if op.name in key else "default"))
        folder = study_dir("tune-model", study, recorder.mlflow.uri)
        database = write_database(folder, tuned, target)
        tuned_mod = apply_database(profile.mod, database, target)
        tuned_ms, outputs = time_model(tuned_mod, target, profile.source.numpy_inputs(), args.repeat)
        err = check_outputs(profile.source, outputs, "the tuned model")
        verification = _verify_model(args, profile, tuned_mod, tuned_ms, target, folder, study)
        metrics = {"torch_ms": profile.torch_ms, "untuned_ms": profile.model_ms, "tuned_ms": tuned_ms,
                   "speedup_vs_untuned": profile.model_ms / tuned_ms, "speedup_vs_torch": profile.torch_ms / tuned_ms,
                   "max_abs_err": err, "tuned_ops": len(tuned)}
        recorder.mlflow.log_parent({"model": args.model, "batch": args.batch, "seq_len": args.seq_len,
                                    "threads": args.threads, "trials_per_op": args.trials_per_op},
                                   {**metrics, **(verification.parent_metrics() if verification else {})},
                                   verification.parent_tags() if verification else {})
        for name in ("database_workload.json", "database_tuning_record.json"):
            recorder.mlflow.log_artifact(folder / name, "database")
    return {"rows": rows, "metrics": metrics, "database": folder, "verification": verification}


def _verify_model(args: argparse.Namespace, profile, tuned_mod, tuned_ms: float, target, folder, study: str):
    """The tuned and untuned builds and PyTorch eager, each timed in fresh processes in alternating rounds
    (None with --verify-rounds 0)."""
    from functools import partial

    from opbench.studies.models.fresh import export_model, in_fresh_process, torch_ms_here, vm_ms_here
    from opbench.studies.verify import BEST, verify_timers

    if args.verify_rounds < 1:
        return None
    print(f"verifying: tuned, untuned and PyTorch in fresh processes, {args.verify_rounds} alternating rounds",
          flush=True)
    inputs = profile.source.numpy_inputs()
    builds = {BEST: (tuned_mod, folder / "tuned.so"), "untuned": (profile.mod, folder / "untuned.so")}
    timers = {name: partial(in_fresh_process, vm_ms_here, str(export_model(mod, target, path)), inputs, args.threads,
                            args.repeat) for name, (mod, path) in builds.items()}
    if profile.source.module is not None:
        timers["torch"] = partial(in_fresh_process, torch_ms_here, args.model, args.batch, args.seq_len,
                                  args.threads, args.repeat)
    measured = {BEST: tuned_ms, "untuned": profile.model_ms, "torch": profile.torch_ms}
    return verify_timers(timers, measured, study, args.verify_rounds)


def model_table(result: dict) -> str:
    """The tuned model against the untuned one and PyTorch: verified speed-ups, or "not verified"."""
    from opbench.studies.verify import speedup_table

    m = result["metrics"]
    refs = {"untuned": {"status": "ok", "latency_ms": m["untuned_ms"]}}
    if m["torch_ms"] == m["torch_ms"]:
        refs["torch"] = {"status": "ok", "latency_ms": m["torch_ms"]}
    return speedup_table({"status": "ok", "latency_ms": m["tuned_ms"]}, refs, result["verification"], "tuned")


def cmd_tune_model(args: argparse.Namespace) -> int:
    result = tune_model(args)
    m = result["metrics"]
    print("\n" + table(result["rows"], ["operator", "kind", "share", "untuned ms", "tuned ms", "speed-up", "how"]))
    print(f"\n{args.model}, batch {args.batch}, {args.threads} thread(s):")
    print(model_table(result))
    print(f"tuned model output matches the reference (max |err| {m['max_abs_err']:.2g}); "
          f"database: {result['database']}")
    return 0


def _model_options(p: argparse.ArgumentParser, study: str | None) -> None:
    p.add_argument("model", help="a name from `opbench models` (add @tiny for the small variant) or a .onnx file")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=128, help="sequence length of token models")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--study", default=study, help="MLflow experiment")
    p.add_argument("--tracking-uri")


def register(sub: argparse._SubParsersAction) -> None:
    from opbench.engines.nni_engine import TUNERS

    p = sub.add_parser("models", help="models that model-ops can extract operators from")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("model-ops", help="a model's fused operators: shapes, FLOPs, calls, share of time")
    _model_options(p, "model-ops")
    p.set_defaults(func=cmd_model_ops)
    p = sub.add_parser("tune-model", help="tune a model's key operators, build it with them, compare with PyTorch")
    _model_options(p, None)
    p.add_argument("--trials-per-op", type=int, default=32)
    p.add_argument("--max-ops", type=int, help="tune at most this many key operators (the largest shares first); "
                                                "every other operator gets the template's default schedule")
    p.add_argument("--verify-rounds", type=int, default=3, metavar="N",
                   help="time the tuned and untuned models and PyTorch again, each in fresh processes, N "
                        "alternating rounds (0: skip; speed-ups are then printed as not verified)")
    p.add_argument("--engine", default="optuna", choices=("optuna", "nni", "random", "model"))
    p.add_argument("--sampler", default="tpe", help="Optuna sampler for --engine optuna")
    p.add_argument("--tuner", default="TPE", choices=TUNERS, help="NNI tuner for --engine nni")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--storage", help="Optuna storage URL (default: sqlite in mlflow/optuna.db)")
    p.set_defaults(func=cmd_tune_model, template=None, search_threads=None, search_cores=None, cores=None,
                   target="llvm", objectives="latency", warm_start=None)
