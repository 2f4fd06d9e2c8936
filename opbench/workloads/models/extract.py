"""A model's operators as TVM sees them: torch.export (or ONNX) -> Relax -> legalised and fused
PrimFuncs, each with its shapes, FLOPs, call count and measured share of the model's time."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opbench.workloads.models.depth_unfold import conv3ds_as_conv2ds
from opbench.workloads.models.dynamic import bound
from opbench.workloads.models.exports import exported_program, onnx_module, relax_module
from opbench.workloads.models.graph import (
    output_channels_padded,
    output_width_padded,
    pad_into_conv,
    pixels_as_one_row,
    unwrap_batch_norm,
)
from opbench.workloads.models.quantize import quantized_as_named
from opbench.workloads.models.sources import ModelSource
from opbench.workloads.models.subpixel import transposed_convs_as_convs

KEY_SHARE = 0.9  # key operators: the fewest that cover this share of the model's time
KINDS = ("depthwise_conv2d", "conv2d_transpose", "conv3d", "conv2d", "batch_matmul", "matmul", "dense", "softmax", "layer_norm", "pool",
         "add", "multiply", "relu", "gelu", "tanh", "sigmoid", "take", "transpose", "reshape",
         "mean", "sum", "max")


@dataclass
class FusedOp:
    name: str  # the fused PrimFunc's name in the module (e.g. fused_matmul_add2)
    kind: str  # anchor op kind read from the name (matmul, conv2d, softmax, ...)
    shapes: list[tuple[int, ...]]  # its buffers, inputs then outputs
    dtype: str
    flops: float
    calls: int
    outputs: int = 1  # the last ``outputs`` buffers are written (destination-passing style)
    latency_ms: float = math.nan  # one call, with its schedule (untuned: TVM's default lowering)
    share: float = math.nan  # calls x latency / sum over all ops
    key: bool = False
    memory: dict[str, float] = field(default_factory=dict)  # its schedule's mem.* (opbench.measure.memory)
    schedule: str = "untuned"  # which schedule latency_ms and memory are of: untuned, default or tuned


def anchor_kind(name: str) -> str:
    """The first op kind of ``KINDS`` (most telling first) named in a fused function's name
    (``fused_conv2d_add_relu`` -> conv2d, ``max_pool2d`` -> pool)."""
    return next((kind for kind in KINDS if kind in name), name.removeprefix("fused_").split("_")[0].rstrip("0123456789"))


def import_model(source: ModelSource) -> Any:
    """The model as a Relax IRModule with its weights bound as constants; one with dynamic dimensions (a token
    model's sequence length, another's batch, an ONNX file's named ones) imported once with them symbolic, then bound to the
    source's sizes (:mod:`.dynamic`); a quantized one's matrix products then int8 (:mod:`.quantize`, calibrated on its
    example inputs' likes where static)."""
    if source.dims or (source.dynamic_axis is not None and source.dynamic_size() > 1):  # torch specialises 1
        mod = bound(source)
    elif source.kind == "onnx":
        mod = onnx_module(source)
    else:
        mod = relax_module(source, exported_program(source))
    return quantized_as_named(mod, source.name, source.numpy_inputs())


# Bumped whenever fuse() makes different PrimFuncs, so that cached extractions of an older one are not read
# (2: fast exp/erf/tanh; 3: batch norms unwrapped, pads folded into convolutions; 4: integer cumsums widened;
# 5: token models take their attention mask and are imported with a symbolic sequence length; 6: a quantized model's
# activations quantized by one kernel each; 7: a model's batch above 1 imported symbolic, then bound; 8: products
# found by one visit each, static int8; 9: transposed convolutions in their sub-pixel form; 10: 3-D convolutions as 2-D
# ones over depth-unfolded input; 11: batch norms folded into the convolutions before them; 12: output channels padded
# to whole vectors; 13: each sub-pixel phase a convolution of its own, no row or column computed twice; 14: a stem's
# output width padded to whole vectors; 15: a 1x1 convolution's pixels as one padded row where rows hold no whole vector;
# 16: a residual add after such a row fused with its convolution).
PIPELINE_VERSION = 16


def fuse(mod: Any) -> Any:
    """Legalise to TIR and fuse (the passes the Relax build runs), leaving one PrimFunc per fused op.
    ``exp``, ``erf`` and ``tanh`` (softmax's and GELU's too) become TVM's fast float32 approximations,
    which vectorise where libm's calls do not (docs/cli.md#models-key-operators-tuned-whole-models has BERT-base's times)."""
    import tvm
    from tvm import relax

    mod = conv3ds_as_conv2ds(transposed_convs_as_convs(pad_into_conv(unwrap_batch_norm(mod))))
    mod = output_channels_padded(pixels_as_one_row(output_width_padded(mod)))
    passes = [relax.transform.FastMathTransform(),
              relax.transform.LegalizeOps({"relax.nn.gelu": _fast_gelu}), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
              relax.transform.DeadCodeElimination()]
    return tvm.ir.transform.Sequential(passes)(mod)


def _fast_gelu(bb: Any, call: Any) -> Any:
    """Relax's GELU legalisation (``x * (0.5 + erf(x / sqrt 2) * 0.5)``) with ``fast_erf`` in float32."""
    from tvm import tirx, topi

    def gelu(x: Any) -> Any:
        dtype = x.dtype
        inner = x * tirx.const(0.5**0.5, dtype)
        erf = topi.fast_erf(inner) if dtype == "float32" else topi.erf(inner)
        return x * (tirx.const(0.5, dtype) + erf * tirx.const(0.5, dtype))

    return bb.call_te(gelu, call.args[0], primfunc_name_hint="gelu")


def call_sites(mod: Any) -> dict[str, tuple[int, int]]:
    """Per PrimFunc ``main`` calls: (how many calls, how many output tensors each call gets)."""
    from tvm import relax

    sites: dict[str, tuple[int, int]] = {}

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            name = expr.args[0].name_hint
            out = expr.ty_args[0]  # the output type (sinfo_args and TupleStructInfo before TVM 0.27)
            outputs = len(out.fields) if isinstance(out, relax.TupleType) else 1
            sites[name] = (sites.get(name, (0, outputs))[0] + 1, outputs)

    relax.analysis.post_order_visit(mod["main"], visit)
    return sites


def fused_ops(mod: Any) -> tuple[list[FusedOp], dict[str, Any]]:
    """The fused PrimFuncs ``main`` calls, as FusedOps, with the PrimFuncs by name."""
    import tvm
    from tvm import tirx
    from tvm.s_tir.analysis import estimate_tir_flops

    sites = call_sites(mod)
    ops, funcs = [], {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or gvar.name_hint not in sites:
            continue
        buffers = list(func.params)  # TVM 0.27: a PrimFunc's params are its buffers (no buffer_map)
        shapes = [tuple(int(d) for d in b.shape) for b in buffers]
        main = func.with_attr("global_symbol", "main")
        calls, outputs = sites[gvar.name_hint]
        ops.append(FusedOp(gvar.name_hint, anchor_kind(gvar.name_hint), shapes, str(buffers[-1].dtype),
                           float(estimate_tir_flops(tvm.IRModule({"main": main}))), calls, outputs))
        funcs[gvar.name_hint] = main
    return ops, funcs


def key_ops(ops: list[FusedOp], latency_ms: Callable[[FusedOp], float]) -> list[FusedOp]:
    """The fewest ops, the largest calls x ``latency_ms`` first, that cover ``KEY_SHARE`` of their summed time."""
    total = sum(op.calls * latency_ms(op) for op in ops)
    key: list[FusedOp] = []
    covered = 0.0
    for op in sorted(ops, key=lambda o: -o.calls * latency_ms(o)):
        if covered >= KEY_SHARE * total:
            break
        key.append(op)
        covered += op.calls * latency_ms(op)
    return key


def mark_shares(ops: list[FusedOp]) -> float:
    """Fill each op's share of the summed op time and mark the key ops; returns that sum (ms)."""
    total = sum(op.calls * op.latency_ms for op in ops)
    for op in ops:
        op.share = op.calls * op.latency_ms / total if total else math.nan
    for op in key_ops(ops, lambda o: o.latency_ms):
        op.key = True
    return total
