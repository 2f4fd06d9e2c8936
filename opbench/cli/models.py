"""``opbench models``, ``opbench model-ops`` (the operators that take a model's time) and
``opbench tune-model`` (tune the key ones, build the model with them, compare with PyTorch)."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from opbench.argtypes import checked, lengths, nonneg_int, positive_int
from opbench.cli._common import BATCH_RENAMED, add_renamed_flag, add_series_flags, timing_of
from opbench.engines.optuna.storage import STORAGE_HELP
from opbench.exceptions import OpBenchError, ResourceError
from opbench.paths import tuned_models_dir
from opbench.report.progress import TrialPrinter, table
from opbench.workloads.models.quantize import MODEL_DTYPES, with_dtype

if TYPE_CHECKING:
    from opbench.engines.registry import EngineSpec
    from opbench.measure.measurer import Measurer
    from opbench.studies.models.profile import ModelProfile
    from opbench.studies.models.tune import ModelSpec, ModelTuneResult, ModelTuneSpec
    from opbench.workloads.models.extract import FusedOp


def cmd_models(args: argparse.Namespace) -> int:
    from opbench.workloads.models.hf import HF_MODELS
    from opbench.workloads.models.sources import TINY, TORCH_MODELS, load_model

    def dynamic(name: str) -> str:
        axis = load_model(name).dynamic_axis  # builds nothing
        return f"{_BUCKETS[axis.name][1]} ({_flag(_BUCKETS[axis.name][0])})" if axis else "-"

    rows = [(name, "torch", f"{name}{TINY}", dynamic(name)) for name in TORCH_MODELS]
    rows += [(name, "transformers", f"{name}{TINY}", dynamic(name)) for name in HF_MODELS]
    rows.append(("simple:WORKLOAD", "one catalogue workload, e.g. simple:matmul-512", "-", "-"))
    rows.append(("PATH.onnx", "onnx", "-", "its named dimensions"))
    print(table(rows, ["model", "source", "tiny variant", "dynamic (its buckets in tune-model)"]))
    return 0


_BUCKETS = {"seq_len": ("seq_len", "sequence length"), "batch": ("batch_size", "batch size")}  # axis: dest, words


def _flag(dest: str) -> str:
    """The option an argparse ``dest`` comes from: batch_size -> --batch-size."""
    return "--" + dest.replace("_", "-")


def _one(args: argparse.Namespace, flag: str) -> int:
    """The one size ``--batch-size`` or ``--seq-len`` gives (several are tune-model's buckets)."""
    sizes = getattr(args, flag)
    if len(sizes) > 1:
        raise OpBenchError(f"{_flag(flag)}: {args.command} runs one size, got "
                           f"{','.join(map(str, sizes))} (several are tune-model's buckets)")
    return int(sizes[0])


def _model_spec(args: argparse.Namespace, buckets: bool = False) -> ModelSpec:
    """The model at the one ``--batch-size`` and ``--seq-len`` given (with ``buckets``: the first of several)."""
    from opbench.studies.models.tune import ModelSpec

    def size(flag: str) -> int:
        return int(getattr(args, flag)[0]) if buckets else _one(args, flag)

    return ModelSpec(args.model, size("batch_size"), size("seq_len"), args.threads, timing_of(args))


def _print_op(n: int, op: FusedOp) -> None:
    print(f"[{n}] {op.name:<40s} {op.latency_ms:9.4f} ms x {op.calls}", flush=True)


def cmd_model_ops(args: argparse.Namespace) -> int:
    args.model = with_dtype(args.model, args.dtype)
    from opbench.studies.models.ops_log import record_ops
    from opbench.studies.models.profile import reference_name
    from opbench.studies.models.scheduled import UNTUNED
    from opbench.studies.models.tune import model_measurer
    from opbench.studies.models.tune import profile as profile_ops
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.sources import SIMPLE_PREFIX

    spec = _model_spec(args)
    with model_measurer(spec) as measurer, tempfile.TemporaryDirectory(prefix="opbench-model-ops-") as folder:
        profile = profile_ops(spec, measurer, Path(folder), _print_op)
        if args.schedules != UNTUNED:
            profile = with_schedules(profile, spec, args.schedules, measurer, Path(folder))
    ops = sorted(profile.ops, key=lambda o: -o.share)
    rows = [("*" if o.key else "", o.name, o.kind, " ".join("x".join(map(str, s)) for s in o.shapes), o.calls,
             o.flops / 1e6, o.schedule, o.latency_ms, o.share, o.memory["mem.workspace"] / 1024,
             o.memory.get("mem.prepacked", 0.0) / 1024) for o in ops]
    print(table(rows, ["key", "function", "kind", "shapes", "calls", "MFLOP", "schedule", "ms/call", "share",
                       "workspace KB", "prepacked KB"]))
    print(f"sum of operators {profile.ops_ms:.3f} ms; whole model on the Relax VM {profile.model_ms:.3f} ms "
          f"(ops / model = {profile.ops_ms / profile.model_ms:.2f}); PyTorch eager {profile.torch_ms:.3f} ms; "
          f"output matches {reference_name(profile.source)} (max |err| {profile.max_abs_err:.2g}); "
          f"key operators (*) cover >= 90% of the operator time with {_schedules_label(args.schedules)}")
    planned = profile.planned
    print(f"planned memory: weights {planned['mem.weights'] / 2**20:.4g} MB, activations "
          f"{planned['mem.activations'] / 2**20:.4g} MB after Relax's memory planning, largest operator workspace "
          f"{planned['mem.largest_workspace'] / 1024:.4g} KB ({_schedules_label(args.schedules)})")
    key = next((o for o in ops if o.key and o.outputs == 1), None)
    if profile.source.kind == "simple":  # a catalogue workload: tune it with its own template
        print(f"tune it: opbench tune '{args.model.removeprefix(SIMPLE_PREFIX)}' --trials 32")
    elif key is not None:
        print(f"tune one: opbench tune '{model_name(args.model, key.name, spec.batch, spec.seq_len)}' --trials 32")
    plot = record_ops(spec, profile, args.study, args.tracking_uri)
    print(f"time against memory per operator: {plot} (also an artifact of the run)")
    return 0


def _schedules_label(schedules: str) -> str:
    from opbench.studies.models.scheduled import DEFAULTS, UNTUNED

    return {UNTUNED: "TVM's default lowering", DEFAULTS: "the template defaults"}.get(
        schedules, f"the tuned schedules of {schedules}")


def with_schedules(profile: ModelProfile, spec: ModelSpec, schedules: str, measurer: Measurer, folder: Path
                   ) -> ModelProfile:
    """``profile`` with the template defaults (``schedules`` = defaults) or a database's tuned schedules."""
    from opbench.hardware.targets import make_target
    from opbench.studies.models.scheduled import DEFAULTS, defaults_database, open_database, reschedule

    target = make_target("llvm", spec.threads)
    if schedules == DEFAULTS:
        database = defaults_database(profile, spec.model, spec.batch, spec.seq_len, target, folder / "defaults")
        return reschedule(profile, database, "default", target, measurer, folder, spec.threads)
    return reschedule(profile, open_database(Path(schedules)), "tuned", target, measurer, folder, spec.threads)


def cmd_tune_model(args: argparse.Namespace) -> int:
    from opbench.engines.registry import EngineSpec
    from opbench.hardware.targets import is_gpu, make_target
    from opbench.studies.models.tune import ModelTuneSpec, tune_model

    args.model = with_dtype(args.model, args.dtype)
    make_target(args.target, 1)  # an unknown target is named
    engine = EngineSpec(args.engine, args.sampler, args.tuner, args.seed, args.storage)
    if is_gpu(args.target):
        return _tune_model_gpu(args, engine)
    if args.target != "llvm":
        raise OpBenchError(f"tune-model runs on this host's CPU (llvm) or a CUDA GPU, not '{args.target}'")
    bucketed = [flag for flag, _ in _BUCKETS.values() if len(getattr(args, flag)) > 1]
    if len(bucketed) > 1:
        raise OpBenchError("--batch-size and --seq-len: buckets along one dynamic dimension at a time")
    spec = ModelTuneSpec(_model_spec(args, buckets=True), args.trials_per_op, args.max_ops, engine,
                         args.verify_rounds, args.study, args.tracking_uri, args.compare, args.reuse)
    if bucketed or args.between:
        return _tune_model_buckets(args, spec)
    printer = TrialPrinter(None)
    result = tune_model(spec, on_record=printer)
    _print_tuned(args, result, spec.model.batch)
    if waited := printer.host_wait_line():
        print(waited)
    return 0


def _print_tuned(args: argparse.Namespace, result: ModelTuneResult, batch: int) -> None:
    from opbench.studies.claims import speedup_table
    from opbench.studies.models.tune import model_speedups

    m = result.metrics
    print("\n" + table(result.rows, ["operator", "kind", "share after defaults", "untuned ms", "tuned ms", "speed-up", "how"]))
    if result.reused:
        print(f"\ntuning {result.reused}")
    print(f"\n{args.model}, batch {batch}, {args.threads} thread(s):")
    print(speedup_table(*model_speedups(result), result.verification, "tuned"))
    print(f"tuned model output matches the reference (max |err| {m['max_abs_err']:.2g}); database: {result.database}")


def _tune_model_buckets(args: argparse.Namespace, spec: ModelTuneSpec) -> int:
    """tune-model at each bucket of the model's dynamic dimension (--seq-len or --batch-size), then the sizes
    between them through the dispatcher."""
    from opbench.studies.claims import spread_text
    from opbench.studies.models.bucketed import default_between, dynamic_axis, tune_bucketed
    from opbench.studies.models.systems import EAGER_ROW
    from opbench.studies.verify import BEST

    axis = dynamic_axis(args.model)
    flag, words = _BUCKETS[axis.name]
    other = next((f for f, _ in _BUCKETS.values() if f != flag and len(getattr(args, f)) > 1), None)
    if other:
        raise OpBenchError(f"{_flag(other)} buckets: {args.model}'s dynamic dimension is its {words} ({_flag(flag)})")
    buckets = getattr(args, flag)
    between = args.between or default_between(buckets)
    result = tune_bucketed(spec, axis, buckets, between, on_record=TrialPrinter(None))
    for bucket, tuned in result.buckets.items():
        print(f"\n=== bucket: {words} {bucket}")
        _print_tuned(args, tuned, bucket if axis.name == "batch" else spec.model.batch)
    rows = [(run.dispatched.size, run.dispatched.bucket, run.dispatched.describe(), f"{run.max_abs_err:.2g}",
             spread_text(run.verification.ratio(BEST, EAGER_ROW) if run.verification else None))
            for run in result.between]
    if rows:
        print(f"\nbetween the buckets, through the dispatcher (output checked against eager at each {axis.noun}; "
              f"latency / eager at that {axis.noun}, in fresh processes):")
        print(table(rows, [axis.noun, "bucket", "how", "max |err|", "tuned / eager (min-max)"]))
    return 0


def _tune_model_gpu(args: argparse.Namespace, engine: EngineSpec) -> int:
    """tune-model on a CUDA GPU: its fused matmuls and convolutions tuned, dlight's schedules for the rest,
    verified beside the dlight build and PyTorch eager on the GPU."""
    from opbench.hardware.targets import cuda_present
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions
    from opbench.record import tee
    from opbench.studies.claims import spread_text
    from opbench.studies.models.gpu import EAGER, GpuModelTune, tune_model_gpu, verify_gpu_model
    from opbench.studies.models.systems import EAGER_ROW, UNTUNED
    from opbench.tracking import Recorder, study_dir

    cpu_only = [flag for flag, used in (("--threads", args.threads != 1), ("--reuse", args.reuse is not None),
                                        ("buckets", len(args.seq_len) > 1 or len(args.batch_size) > 1),
                                        ("--between", bool(args.between)),
                                        ("--compare", args.compare != (UNTUNED, EAGER_ROW))) if used]
    if cpu_only:
        raise OpBenchError(f"{', '.join(cpu_only)}: not for --target {args.target} (one host thread drives the GPU; "
                           "the tuned model is verified beside dlight's build and PyTorch eager)")
    if not cuda_present():
        raise ResourceError(f"--target {args.target}: no CUDA GPU visible to TVM on this machine")
    spec = GpuModelTune(_model_spec(args), args.trials_per_op, args.max_ops, engine, args.target)
    study = args.study or f"tune-model-{args.model}-cuda"
    with Measurer(MeasureOptions(spec.model.timing)) as measurer:
        with Recorder(study, args.tracking_uri) as recorder:
            built = tune_model_gpu(spec, measurer, tee(recorder, TrialPrinter(None)),
                                   study_dir("tune-model", study, args.tracking_uri), study)
        print("\n" + table(built.rows, ["operator", "calls", "template default ms", "tuned ms"]))
        if args.verify_rounds:
            verified = verify_gpu_model(measurer, spec, built, "tuned", args.verify_rounds)
            print("\n" + table([(label, spread_text(s.latency), spread_text(verified.ratio(label, EAGER)),
                                 "; ".join(s.errors)[:120] or "-") for label, s in verified.schedules.items()],
                               ["system", "verified ms (min-max)", "latency / eager", "errors"]))
    return 0


def _model_options(p: argparse.ArgumentParser, study: str | None) -> None:
    p.add_argument("model", help="a name from `opbench models` (add @tiny for the small variant) or a .onnx file (a named "
                        "dimension leading an input is --batch-size, one elsewhere --seq-len)")
    p.add_argument("--batch-size", type=lengths, default=(1,), metavar="N[,N...]",
                   help="the model's batch size (tune-model: several, comma-separated, are buckets of a model whose "
                        "batch is dynamic: imported once with a symbolic batch and built at each)")
    p.add_argument("--dtype", choices=MODEL_DTYPES, default="float32",
                   help="int8: the model quantized (its name +int8): matrix products and convolutions by a constant "
                        "weight u8 x i8 into i32, activations per tensor at run time, weights per output column or "
                        "channel; its output checked for agreement with the fp32 model's (cosine >= 0.99)")
    add_renamed_flag(p, "--batch", BATCH_RENAMED)
    p.add_argument("--seq-len", type=lengths, default=(128,), metavar="N[,N...]",
                   help="sequence length of token models (tune-model: several, comma-separated, are buckets: the "
                        "model is imported once with a symbolic length and built at each)")
    p.add_argument("--threads", type=positive_int, default=1)
    add_series_flags(p)
    p.add_argument("--study", default=study, help="MLflow experiment")
    p.add_argument("--tracking-uri")


def register(sub: argparse._SubParsersAction) -> None:
    from opbench.engines.nni.engine import TUNERS
    from opbench.studies.models.scheduled import DEFAULTS, SCHEDULES_HELP, parse_schedules
    from opbench.studies.models.systems import EAGER_ROW, SYSTEMS, UNTUNED, parse_systems

    p = sub.add_parser("models", help="models that model-ops can extract operators from")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("model-ops", help="a model's fused operators: shapes, FLOPs, calls, share of time, memory")
    _model_options(p, "model-ops")
    p.add_argument("--schedules", type=checked(parse_schedules), default=DEFAULTS, help=SCHEDULES_HELP)
    p.set_defaults(func=cmd_model_ops)
    p = sub.add_parser("tune-model", help="tune a model's key operators, build it with them, compare with PyTorch")
    _model_options(p, None)
    p.add_argument("--trials-per-op", type=positive_int, default=32)
    p.add_argument("--max-ops", type=positive_int, help="tune at most this many key operators (the largest shares after the "
                                                "template defaults first); "
                                                "every other operator gets the template's default schedule")
    p.add_argument("--verify-rounds", type=nonneg_int, default=3, metavar="N",
                   help="time the tuned model and --compare's systems again, each in fresh processes, N "
                        "alternating rounds (0: skip; speed-ups are then printed as not verified)")
    p.add_argument("--compare", type=checked(parse_systems), default=(UNTUNED, EAGER_ROW), metavar="SYSTEMS",
                   help=f"what the tuned model is verified against, comma-separated: {', '.join(SYSTEMS)} "
                        "(torch: PyTorch eager; torch.compile: AOTInductor, compiled once; openvino and zentorch: "
                        "optional extras, skipped saying why where they cannot run; torch-sparse: the model's sparse "
                        "form in PyTorch, the GCN's)")
    p.add_argument("--engine", default="optuna", choices=("optuna", "nni", "random", "model"))
    p.add_argument("--sampler", default="tpe", help="Optuna sampler for --engine optuna")
    p.add_argument("--tuner", default="TPE", choices=TUNERS, help="NNI tuner for --engine nni")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--between", type=lengths, metavar="N[,N...]",
                   help="with buckets: sizes between them to run through the dispatcher, each on the "
                        "next bucket up, padded (default: midway between the first two buckets)")
    p.add_argument("--reuse", nargs="?", type=Path, const=tuned_models_dir(), metavar="DIR",
                   help="keep this run's tuning in DIR (default: the store's tuned-models folder) and build from what "
                        "a run with the same model, shapes, threads, budget, engine, CPU model and TVM version kept there")
    p.add_argument("--target", default="llvm", help="llvm (this CPU), or cuda / 'cuda -arch=sm_XX': the fused "
                                                   "matmuls and convolutions tuned on the GPU, dlight's schedules "
                                                   "for the rest")
    p.set_defaults(func=cmd_tune_model, template=None, search_threads=None, search_cores=None, cores=None,
                   objectives="latency", warm_start=None)
