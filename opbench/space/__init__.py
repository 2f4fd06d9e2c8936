"""Schedule templates and the per-workload search spaces they derive (``opbench space W --json``)."""
from __future__ import annotations

from typing import Any

from opbench.exceptions import WorkloadError
from opbench.space._base import Config, Knob, Nest, Template
from opbench.space.amx import AmxTemplate
from opbench.space.dot_conv import DotProductConvTemplate
from opbench.space.dot_product import DotProductTemplate
from opbench.space.fused import FusedTemplate
from opbench.space.fused_matmul import FusedMatmulTemplate
from opbench.space.gpu import GPU_TEMPLATES
from opbench.space.packed import PackedConvTemplate
from opbench.space.prescheduled import IRFileTemplate
from opbench.space.rowwise import FusedRowwiseTemplate, NoScheduleTemplate, RowwiseTemplate
from opbench.space.tiled import TiledTemplate
from opbench.workloads import Workload
from opbench.workloads._base import BF16, INT8

__all__ = ["Config", "Knob", "Nest", "Template", "TEMPLATES", "computed_flops", "get_template"]

_WINDOW: dict[str, Any] = {"untiled_spatial": 1, "has_pad": True}  # n stays whole; a padding stage may exist
TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        TiledTemplate("matmul", tiled=("i", "j"), reduce_tiled=("k",)),
        TiledTemplate("batch_matmul", tiled=("i", "j"), reduce_tiled=("k",), untiled_spatial=1),
        TiledTemplate("dense", tiled=("i", "j"), reduce_tiled=("k",), contiguous_columns=False),
        TiledTemplate("conv2d", tiled=("f", "y", "x"), reduce_tiled=("rc",), **_WINDOW),
        TiledTemplate("depthwise_conv2d", tiled=("c", "y", "x"), **_WINDOW),
        TiledTemplate("pool2d", tiled=("c", "y", "x"), **_WINDOW),
        TiledTemplate("conv3d", tiled=("f", "y", "x"), reduce_tiled=("rc",), untiled_spatial=2, has_pad=True),  # n, z whole
        TiledTemplate("conv2d_transpose", tiled=("f", "y", "x"), reduce_tiled=("rc",), **_WINDOW),
        DotProductTemplate("dense_int8", op="dense", dtype=INT8),
        DotProductTemplate("matmul_int8", op="matmul", dtype=INT8),
        DotProductTemplate("fused_matmul_int8", op="fused_matmul", dtype=INT8),
        DotProductConvTemplate("conv2d_nchwc_int8", op="conv2d", dtype=INT8),
        DotProductConvTemplate("fused_conv2d_nchwc_int8", op="fused_conv2d", dtype=INT8),
        AmxTemplate("dense_amx_int8", op="dense", dtype=INT8),
        AmxTemplate("matmul_amx_int8", op="matmul", dtype=INT8),
        AmxTemplate("fused_matmul_amx_int8", op="fused_matmul", dtype=INT8),
        AmxTemplate("dense_amx_bf16", op="dense", dtype=BF16),
        AmxTemplate("matmul_amx_bf16", op="matmul", dtype=BF16),
        DotProductTemplate("dense_bf16", op="dense", dtype=BF16),
        DotProductTemplate("matmul_bf16", op="matmul", dtype=BF16),
        DotProductConvTemplate("conv2d_nchwc_bf16", op="conv2d", dtype=BF16),
        PackedConvTemplate("conv2d_nchwc", op="conv2d"),
        PackedConvTemplate("depthwise_conv2d_nchwc", op="depthwise_conv2d", depthwise=True),
        PackedConvTemplate("fused_conv2d_nchwc", op="fused_conv2d"),
        PackedConvTemplate("fused_depthwise_conv2d_nchwc", op="fused_depthwise_conv2d", depthwise=True),
        RowwiseTemplate("softmax"),
        RowwiseTemplate("layer_norm"),
        RowwiseTemplate("add_relu", fuse_all=True),
        FusedTemplate(),
        FusedMatmulTemplate(),
        FusedRowwiseTemplate(),
        NoScheduleTemplate(),
        IRFileTemplate(),
        *GPU_TEMPLATES,
    )
}
GENERIC_TEMPLATES = ("te_default", "metaschedule")  # TVM's own schedules of any op, not a config of a template's
LIBRARY_TEMPLATES = ("torch", "numpy", "onnxruntime")  # a library baseline: a trial of one times the library, never a TVM kernel
SPECIAL_TEMPLATES = GENERIC_TEMPLATES + LIBRARY_TEMPLATES  # records whose knobs are no config of the op's template
# An op kind's template on CPUs where it is not the one named after the op: packed convolutions beat
# the tiled NCHW ones (which stay available as ``--template conv2d`` / ``depthwise_conv2d``); a
# model's fused convolutions, matmuls, softmaxes and layer norms get the catalogue's templates
# (``--template fused`` for the generic fused template).
CPU_DEFAULTS = {"conv2d": "conv2d_nchwc", "depthwise_conv2d": "depthwise_conv2d_nchwc",
                "fused_conv2d": "fused_conv2d_nchwc", "fused_depthwise_conv2d": "fused_depthwise_conv2d_nchwc",
                "fused_matmul": "fused_matmul", "fused_rowwise": "fused_rowwise"}
# int8 and bf16 matrix products and convolutions (a quantized model's too) take the first of these templates that
# applies: AMX tiles on a CPU with them, for whole tiles (opbench.space.amx), else the CPU's dot-product instruction
# for the dtype (dot_product.INSTRUCTIONS), for operands of that dtype
DOT_DEFAULTS = {"dense": ("dense_amx_int8", "dense_amx_bf16", "dense_int8", "dense_bf16"),
                "matmul": ("matmul_amx_int8", "matmul_amx_bf16", "matmul_int8", "matmul_bf16"),
                "fused_matmul": ("fused_matmul_amx_int8", "fused_matmul_int8"),
                "conv2d": ("conv2d_nchwc_int8", "conv2d_nchwc_bf16"), "fused_conv2d": ("fused_conv2d_nchwc_int8",)}


def get_template(workload: Workload, name: str | None = None, target: str = "llvm") -> Template:
    """The template for ``workload``: its op's default for ``target`` (``cuda_<op>`` on GPUs,
    :data:`CPU_DEFAULTS` or the op's own on CPUs) unless ``name`` picks another that applies; whether a template
    applies is judged on ``target``'s CPU (the instructions it has), not this host's."""
    from opbench.hardware.cpu_shape import shaped_for

    with shaped_for(target):
        return _template(workload, name, target)


def _template(workload: Workload, name: str | None, target: str) -> Template:
    from opbench.hardware.targets import is_gpu

    kind = workload.kind
    if name is None and is_gpu(target):
        name = f"cuda_{kind}"
        if name not in TEMPLATES:
            gpu_ops = ", ".join(t.op for t in GPU_TEMPLATES)
            raise WorkloadError(f"no CUDA template for operator '{kind}' (CUDA templates: {gpu_ops})")
    name = name or _dot_default(workload) or CPU_DEFAULTS.get(kind, workload.op.name)
    if name not in TEMPLATES:
        raise WorkloadError(f"unknown template '{name}'; templates: {', '.join(TEMPLATES)}")
    if getattr(TEMPLATES[name], "op", name) not in (workload.op.name, kind) and name not in GENERIC_TEMPLATES:
        raise WorkloadError(f"template '{name}' does not apply to operator '{workload.name}'")
    TEMPLATES[name].check_applies(workload)
    return TEMPLATES[name]


def _dot_default(workload: Workload) -> str | None:
    """The first of :data:`DOT_DEFAULTS`' templates of ``workload`` that the CPU in force runs (AMX tiles, then its
    dot-product instruction); None where none applies."""
    return next((name for name in DOT_DEFAULTS.get(workload.kind, ()) if not TEMPLATES[name].refusal(workload)), None)


def computed_flops(workload: Workload, template: str, config: Config, target: str = "llvm") -> float:
    """FLOPs a trial of ``template`` (validated ``config``) computes: :meth:`Template.arithmetic_flops`, the workload's
    own for a library baseline."""
    if template in LIBRARY_TEMPLATES:
        return workload.flops
    return get_template(workload, template, target).arithmetic_flops(config, workload)
