"""OpBench on an NVIDIA GPU against PyTorch on the same GPU, measured in one run (nothing without a GPU).

Operators (matmul-1024, resnet50-c2, bert-base-ffn1 by default): the CUDA template's default config and
the best of an Optuna study of ``--trials`` trials, as ``opbench tune --target cuda`` runs it, against
torch on the GPU (float32 with TF32 off, as TVM's kernels compute), timed in processes that never load
TVM. Whole models (``--models``): PyTorch eager on the GPU against the fused model built for CUDA twice:
with TVM's dlight rules scheduling every operator (untuned), and with OpBench's tuned schedules for its
fused matmuls and convolutions (``--model-trials`` each, at most ``--max-ops`` operators, the most FLOPs
first; dlight for the rest); each build's output is checked against PyTorch's. Every latency printed is
verified: re-measured in fresh processes over ``--rounds`` alternating rounds (median, with the range),
each a record in the run's MLflow store.

    .venv/bin/python benchmarks/cuda_vs_torch.py [--trials 32] [--workloads W ...] [--models bert-base ...]
        [--model-trials 16] [--max-ops 12] [--rounds 3]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _results import Results

from opbench.engines.loop import run_tuning
from opbench.engines.optuna.engine import OptunaEngine
from opbench.engines.optuna.storage import default_storage
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.hardware.targets import cuda_present
from opbench.measure.measurer import Measurer
from opbench.measure.types import MeasureOptions
from opbench.record import tee
from opbench.report.progress import TrialPrinter, table
from opbench.space import get_template
from opbench.studies.claims import spread_text
from opbench.studies.models.gpu import EAGER, GpuModelTune, tune_model_gpu, verify_gpu_model
from opbench.studies.models.tune import ModelSpec
from opbench.studies.references import measure_references
from opbench.studies.verify import BEST, verify
from opbench.tracking import Recorder
from opbench.workloads import parse_workload

WORKLOADS = ("matmul:m=1024,n=1024,k=1024", "resnet50-c2", "bert-base-ffn1")
MODELS = ("bert-base", "resnet-50")
GPU = Resources(1, target="cuda")  # one host thread drives the GPU


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), metavar="W")
    parser.add_argument("--models", nargs="*", default=list(MODELS), metavar="M")
    parser.add_argument("--model-trials", type=int, default=16, help="trials per tuned operator of a model")
    parser.add_argument("--max-ops", type=int, default=12, help="operators tuned per model")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process verification rounds")
    args = parser.parse_args()
    if not cuda_present():
        print("no CUDA GPU visible to TVM here: nothing measured")
        return
    scratch = Path(tempfile.mkdtemp(prefix="opbench-cuda-"))
    tracking = f"sqlite:///{scratch}/mlflow.db"
    import tvm

    results = Results("cuda_vs_torch", device=tvm.cuda(0).device_name)
    results.print(f"GPU: {gpu_name()}; float32, TF32 off in torch; verified: median of {args.rounds} fresh-process "
                  "rounds (min-max)")
    with Measurer(MeasureOptions(build_workers=8)) as measurer:
        if args.workloads:
            results.table(operators(measurer, args.workloads, args.trials, args.rounds, scratch, tracking))
        if args.models:
            tune = {name: GpuModelTune(ModelSpec(name), args.model_trials, args.max_ops) for name in args.models}
            results.table(models(measurer, tune, args.rounds, scratch, tracking))
    results.save()


def gpu_name() -> str:
    import tvm

    dev = tvm.cuda(0)
    return f"{dev.device_name} (compute {dev.compute_version}, {dev.multi_processor_count} SMs)"


def operators(measurer: Measurer, names: list[str], trials: int, rounds: int, scratch: Path, tracking: str) -> str:
    """Each operator tuned on the GPU as ``opbench tune --target cuda`` tunes it, then verified against torch."""
    rows = []
    for name in names:
        workload = parse_workload(name)
        template = get_template(workload, target=GPU.target)
        with Recorder(f"cuda-{workload.name}", tracking, background_lock=HostLock(measurer.options.lock_path)) as recorder:
            refs = measure_references(measurer, workload, GPU, recorder, verified=True)
            engine = OptunaEngine(template.search_space(workload), 1, name, default_storage(scratch), seed=0,
                                  budget=trials)
            print(f"--- {name}: {trials} trials on the GPU", flush=True)
            records = run_tuning(engine, workload, trials, measurer, tee(recorder, TrialPrinter(trials)), GPU, fresh=True)
            verified = verify(measurer, [*refs.values(), *records], name, rounds, on_record=recorder)
        for label, schedule in verified.schedules.items():
            lat = schedule.latency
            vs_torch = verified.ratio(label, "torch") if "torch" in verified.schedules else None
            gflops = "-" if lat is None else f"{workload.flops / (lat.median * 1e-3) / 1e9:.0f}"
            rows.append((workload.name, f"optuna best of {trials}" if label == BEST else label, spread_text(lat), gflops,
                         spread_text(vs_torch)))
    return table(rows, ["operator", "schedule", "verified ms (min-max)", "GFLOP/s", "latency / torch (min-max)"])


def models(measurer: Measurer, specs: dict[str, GpuModelTune], rounds: int, scratch: Path, tracking: str) -> str:
    """Each model tuned for CUDA and built with and without the tuned schedules, checked, and verified
    against eager."""
    rows = []
    for name, spec in specs.items():
        print(f"--- {name}: its fused matmuls and convolutions tuned on the GPU, {spec.trials_per_op} trials each "
              f"(at most {spec.max_ops} operators); dlight schedules the rest", flush=True)
        with Recorder(f"cuda-model-{name}", tracking, background_lock=HostLock(measurer.options.lock_path)) as recorder:
            built = tune_model_gpu(spec, measurer, tee(recorder, TrialPrinter(None)), scratch / name)
        for op, calls, default_ms, best_ms in built.rows:
            print(f"    {op}: {calls} calls, template default {default_ms:.4f} ms, best {best_ms:.4f} ms", flush=True)
        verified = verify_gpu_model(measurer, spec, built, f"OpBench tuned ({len(built.rows)} ops, {built.trials} trials)",
                                    rounds)
        for label, schedule in verified.schedules.items():
            rows.append((name, label, spread_text(schedule.latency), spread_text(verified.ratio(label, EAGER)),
                         "; ".join(schedule.errors)[:120] or "-"))
    return table(rows, ["model", "system", "verified ms (min-max)", "latency / eager (min-max)", "errors"])


if __name__ == "__main__":
    main()
