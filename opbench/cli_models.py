"""``opbench models`` and ``opbench model-ops``: real models and the operators that take their time."""
from __future__ import annotations

import argparse
import math
import time

from opbench.exceptions import OpBenchError
from opbench.progress import table


def cmd_models(args: argparse.Namespace) -> int:
    from opbench.models.hf import HF_MODELS
    from opbench.models.sources import TINY, TORCH_MODELS

    rows = [(name, "torch", f"{name}{TINY}") for name in TORCH_MODELS]
    rows += [(name, "transformers", f"{name}{TINY}") for name in HF_MODELS]
    rows.append(("PATH.onnx", "onnx", "-"))
    print(table(rows, ["model", "source", "tiny variant"]))
    return 0


def _torch_ms(source, threads: int, repeat: int) -> float:
    """PyTorch eager: median ms per forward."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    times = []
    with torch.no_grad():
        for _ in range(repeat + 1):
            start = time.perf_counter()
            source.module(*source.inputs)
            times.append(time.perf_counter() - start)
    return float(np.median(times[1:])) * 1e3


def cmd_model_ops(args: argparse.Namespace) -> int:
    import numpy as np
    import tvm

    from opbench.models import cache
    from opbench.models.extract import fuse, fused_ops, import_model, mark_shares, time_model, time_primfunc
    from opbench.workloads.fused import model_name
    from opbench.models.sources import load_model
    from opbench.resources import make_target
    from opbench.tracking import Recorder

    source = load_model(args.model, args.batch, args.seq_len)
    tvm.get_global_func("runtime.config_threadpool")(-3, args.threads, [])
    target = make_target("llvm", args.threads)
    mod = fuse(import_model(source))
    ops, funcs = fused_ops(mod)
    print(f"{source.name}: {len(ops)} fused operators; timing each ({args.threads} threads)", flush=True)
    for n, op in enumerate(ops, start=1):
        op.latency_ms = time_primfunc(funcs[op.name], target, args.repeat)
        print(f"[{n}/{len(ops)}] {op.name:<40s} {op.latency_ms:9.4f} ms x {op.calls}", flush=True)
    ops_ms = mark_shares(ops)
    cache.save(args.model, args.batch, args.seq_len, ops, funcs)
    model_ms, outputs = time_model(mod, target, source.numpy_inputs(), args.repeat)
    torch_ms = _torch_ms(source, args.threads, args.repeat) if source.module is not None else math.nan
    expected = source.reference()
    err = float(np.max(np.abs(outputs[0] - expected[0])))
    reference = "torch" if source.module is not None else "ONNX's reference evaluator"
    if not np.allclose(outputs[0], expected[0], rtol=1e-3, atol=1e-3):
        raise OpBenchError(f"{source.name}: TVM's output differs from {reference}'s (max |err| {err:.3g})")
    ops.sort(key=lambda o: -o.share)
    rows = [("*" if o.key else "", o.name, o.kind, " ".join("x".join(map(str, s)) for s in o.shapes), o.calls,
             o.flops / 1e6, o.latency_ms, o.share) for o in ops]
    print(table(rows, ["key", "function", "kind", "shapes", "calls", "MFLOP", "ms/call", "share"]))
    print(f"sum of operators {ops_ms:.3f} ms; whole model on the Relax VM {model_ms:.3f} ms "
          f"(ops / model = {ops_ms / model_ms:.2f}); PyTorch eager {torch_ms:.3f} ms; output matches {reference} "
          f"(max |err| {err:.2g}); key operators (*) cover >= 90% of operator time")
    key = next((o for o in ops if o.key and o.outputs == 1), None)
    if key is not None:
        print(f"tune one: opbench tune '{model_name(args.model, key.name, args.batch, args.seq_len)}' --trials 32")
    with Recorder(args.study, args.tracking_uri, extra={"engine": "model-ops"},
                  parent_tags={"model": source.name}) as recorder:
        for op in ops:
            recorder({"workload": model_name(args.model, op.name, args.batch, args.seq_len), "op": op.kind, "dtype": op.dtype,
                      "shape": ";".join("x".join(map(str, s)) for s in op.shapes), "source_model": source.name,
                      "threads": args.threads, "status": "ok", "latency_ms": op.latency_ms, "calls": op.calls,
                      "share": op.share, "key_op": op.key, "flops": op.flops,
                      "gflops": op.flops / (op.latency_ms * 1e-3) / 1e9 if op.latency_ms > 0 else math.nan})
        recorder.mlflow.log_parent({"model": source.name, "batch": args.batch, "seq_len": args.seq_len,
                                    "threads": args.threads},
                                   {"model_ms": model_ms, "ops_sum_ms": ops_ms, "torch_ms": torch_ms,
                                    "max_abs_err": err, "fused_ops": len(ops)})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="models that model-ops can extract operators from")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("model-ops", help="a model's fused operators: shapes, FLOPs, calls, share of time")
    p.add_argument("model", help="a name from `opbench models` (add @tiny for the small variant)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=128, help="sequence length of token models")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--study", default="model-ops", help="MLflow experiment")
    p.add_argument("--tracking-uri")
    p.set_defaults(func=cmd_model_ops)
