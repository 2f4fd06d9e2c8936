"""Graph rewrites run before a model is fused, so that each convolution fuses with what follows it, and one that
lets Relax's frontend import what PyTorch exports."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

SPATIAL_PAD = slice(4, 8)  # an NCHW pad's pad_width: (N, C, H, W) x (before, after); H and W are the last four
# A convolution's output channels are padded to a multiple of the widest CPU vector's fp32 lanes (AVX-512's 16, which
# AVX2's 8 divide: the same graph on every host) where that computes at most this share of them as padding
CHANNEL_MULTIPLE = 16
PADDING_SHARE = 1 / 32
WIDTH_PADDING_SHARE = 1 / 8  # the columns a stem's output width may be padded by (output_width_padded)
Padded = tuple[Any, list[int], int, int] | None  # a convolution's weight and padding, the axis to crop, what it keeps


def unwrap_batch_norm(mod: Any) -> Any:
    """Inference batch norms folded into the convolution before them where both have constant parameters (its
    weight scaled, a bias added: the convolution's epilogue adds a bias instead of subtracting, dividing,
    multiplying and adding per element), the others decomposed into elementwise ops; and their
    ``(out, mean, var)[0]`` tuples folded away: a tuple ends a fusion group, which left each ReLU or ReLU6 after a
    conv + batch norm a kernel of its own (and a pass over its output)."""
    import tvm
    from tvm import relax

    return tvm.ir.transform.Sequential([relax.transform.FoldBatchnormToConv2D(), relax.transform.FoldConstant(),
                                        relax.transform.DecomposeOpsForInference(),
                                        relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])(mod)


def pad_into_conv(mod: Any) -> Any:
    """``conv2d(pad(x))`` with a zero spatial pad (TF-style "same" padding, asymmetric where strided: Hugging
    Face's MobileNetV2) as one ``conv2d(x)`` padding by as much: the pad becomes the convolution's own padding
    stage, which its template inlines, instead of a kernel of its own fused with the op before it."""
    from tvm import relax
    from tvm.relax.dpl import is_op, wildcard

    data, weight = wildcard(), wildcard()
    pad = is_op("relax.nn.pad")(data)
    conv = is_op("relax.nn.conv2d")(pad, weight)

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        p, c = matches[pad].attrs, matches[conv].attrs
        widths = [int(w) for w in p.pad_width]
        if p.pad_mode != "constant" or float(p.pad_value) != 0.0 or c.data_layout != "NCHW" or any(widths[:4]):
            return expr
        top, bottom, left, right = widths[SPATIAL_PAD]
        padding = [int(v) for v in c.padding]  # top, left, bottom, right
        return relax.op.nn.conv2d(matches[data], matches[weight], c.strides,
                                  [padding[0] + top, padding[1] + left, padding[2] + bottom, padding[3] + right],
                                  c.dilation, c.groups, c.data_layout, c.kernel_layout, c.out_layout, c.out_dtype)

    return rewrite_calls(mod, conv, rewrite)


def output_channels_padded(mod: Any) -> Any:
    """Each float32 one-group NCHW ``conv2d`` by a constant weight whose output channels :data:`CHANNEL_MULTIPLE`
    does not divide, where padding them to it costs at most :data:`PADDING_SHARE` of them (SqueezeNet's 1000
    classes: 1008; YOLOv3's 255 box fields: 256), computed padded, its weight padded with zero filters, and cropped
    by a slice: its template's register tile then holds whole vectors, where 1000 channels took blocks of 10 lanes
    (docs/workloads-and-templates.md#padded-channels)."""
    import numpy as np
    from tvm import relax

    def padded(attrs: Any, weight: Any, out_type: Any) -> Padded:
        w = weight.value.numpy()
        channels = w.shape[0]
        extra = -channels % CHANNEL_MULTIPLE
        if not extra or extra > channels * PADDING_SHARE:
            return None
        return relax.const(np.pad(w, [(0, extra), (0, 0), (0, 0), (0, 0)])), list(attrs.padding), 1, channels

    return _computed_padded_and_cropped(mod, padded)


def output_width_padded(mod: Any) -> Any:
    """Each float32 one-group NCHW ``conv2d`` of fewer input channels than :data:`CHANNEL_MULTIPLE` (a network's stem)
    by a constant weight, whose output width no vector of 8 lanes divides, where padding that width to a multiple of
    :data:`CHANNEL_MULTIPLE` costs at most :data:`WIDTH_PADDING_SHARE` of it (SqueezeNet's 111 columns: 112;
    Inception-v3's 149: 160), computed that wide (as much more padding on the input's right as the stride takes) and
    cropped by a slice: its rows are then whole vectors, which the stem's column schedule takes, where 111 columns
    left the packed direct schedule register tiles of 1 or 3 columns (docs/workloads-and-templates.md#padded-width)."""
    from tvm import tirx

    def padded(attrs: Any, weight: Any, out_type: Any) -> Padded:
        width = out_type.shape.values[3] if out_type.shape is not None else None
        _, channels, rows, columns = weight.value.shape
        if not isinstance(width, tirx.IntImm) or channels >= CHANNEL_MULTIPLE or rows * columns == 1:
            return None
        width = int(width)
        extra = -width % CHANNEL_MULTIPLE
        if width % (CHANNEL_MULTIPLE // 2) == 0 or extra > width * WIDTH_PADDING_SHARE:
            return None
        top, left, bottom, right = (int(v) for v in attrs.padding)
        return weight, [top, left, bottom, right + extra * int(attrs.strides[1])], 3, width

    return _computed_padded_and_cropped(mod, padded)


def _computed_padded_and_cropped(mod: Any, padded: Callable[[Any, Any, Any], Padded]) -> Any:
    """``mod`` with each float32 one-group NCHW ``conv2d`` by a constant weight for which ``padded(attrs, weight,
    output type)`` gives ``(weight, padding, axis, kept)`` computed with that weight and padding, then cropped by a
    slice to its first ``kept`` along ``axis``."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, wildcard

    data, weight = wildcard(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight)

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        c = matches[conv].attrs
        if (c.groups != 1 or matches[weight].value.dtype != "float32"
                or (c.data_layout, c.kernel_layout, c.out_layout) != ("NCHW", "OIHW", "NCHW")):
            return expr
        if (plan := padded(c, matches[weight], matches[conv].ty)) is None:
            return expr
        new_weight, padding, axis, kept = plan
        out = relax.op.nn.conv2d(matches[data], new_weight, c.strides, padding, c.dilation, 1, c.data_layout,
                                 c.kernel_layout, c.out_layout, c.out_dtype)
        return relax.op.strided_slice(out, axes=[axis], begin=[0], end=[kept])

    return rewrite_calls(mod, conv, rewrite)


def rewrite_calls(mod: Any, pattern: Any, rewrite: Callable[[Any, dict[Any, Any]], Any]) -> Any:
    """``mod`` with each call in its Relax functions that ``pattern`` matches replaced by ``rewrite(call, matches)``."""
    from tvm import relax
    from tvm.relax.dpl import rewrite_call

    out = mod.clone()
    for name, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[name] = rewrite_call(pattern, rewrite, func)
    return out


def integer_cumsum_widened(exported: Any) -> Any:
    """``exported`` (a torch ExportedProgram) with each cumsum of a bool or integer tensor naming int64, the type
    PyTorch gives it: Relax's frontend keeps the input's type where none is named, and a cumsum of bools then
    fails to build (GPT-2's mask preparation has one)."""
    import torch

    for node in exported.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.cumsum.default and "dtype" not in node.kwargs:
            value = node.args[0].meta.get("val")
            if value is not None and not (value.dtype.is_floating_point or value.dtype.is_complex):
                node.kwargs = {**node.kwargs, "dtype": torch.int64}
    return exported
