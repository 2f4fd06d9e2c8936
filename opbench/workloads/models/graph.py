"""Graph rewrites run before a model is fused, so that each convolution fuses with what follows it, and one that
lets Relax's frontend import what PyTorch exports."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

SPATIAL_PAD = slice(4, 8)  # an NCHW pad's pad_width: (N, C, H, W) x (before, after); H and W are the last four
# A convolution's output channels are padded to a multiple of the widest CPU vector's fp32 lanes (AVX-512's 16, which
# AVX2's 8 divide: the same graph on every host) where that computes at most this share of them as padding
CHANNEL_MULTIPLE = 16
PADDING_SHARE = 1 / 32
WIDTH_PADDING_SHARE = 1 / 8  # the columns a stem's output width may be padded by (output_width_padded)
PIXEL_PADDING_SHARE = 1 / 16  # the pixels a 1x1 convolution's may be padded by (pixels_as_one_row)
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


def pixels_as_one_row(mod: Any) -> Any:
    """Each float32 one-group NCHW 1x1 ``conv2d`` (stride 1, no padding) by a constant weight whose output has
    no run of whole 8-lane vectors in a part of a row or in whole rows (13x13, 14x14, 17x17, 27x27), where padding
    its pixels to a multiple of :data:`CHANNEL_MULTIPLE` adds at most :data:`PIXEL_PADDING_SHARE` of them:
    computed on its pixels as one row (a reshape), padded on the right with zeros to that multiple (a pad its
    producer computes as it writes), cropped and reshaped back. Its register tiles then hold whole vectors of
    pixels or wide column tiles, where a 13-wide row left the direct schedule one vector by 13 columns
    (docs/workloads-and-templates.md#pixels-in-a-row)."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, wildcard

    data, weight = wildcard(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight)

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        c, shape = matches[conv].attrs, _static_shape(matches[data])
        if not _plain_float_conv(c, matches[weight]) or shape is None or any(int(v) for v in c.padding) or any(
                int(v) != 1 for v in (*c.strides, *c.dilation, *matches[weight].value.shape[2:])):
            return expr
        n, channels, rows, columns = shape
        if (padded := row_of_pixels(rows, columns)) is None:
            return expr
        pixels, extra = rows * columns, padded - rows * columns
        row = relax.op.nn.pad(relax.op.reshape(matches[data], (n, channels, 1, pixels)), [0, 0, 0, 0, 0, 0, 0, extra])
        out = relax.op.nn.conv2d(row, matches[weight], c.strides, c.padding, c.dilation, 1, c.data_layout,
                                 c.kernel_layout, c.out_layout, c.out_dtype)
        kept = relax.op.strided_slice(out, axes=[3], begin=[0], end=[pixels])
        return relax.op.reshape(kept, (n, int(matches[weight].value.shape[0]), rows, columns))

    mod, moved = rewrite_calls(mod, conv, rewrite), 1
    while moved:  # a step of each epilogue a pass
        mod, moved = _epilogue_above_row_reshape(mod)
    return mod


def row_of_pixels(rows: int, columns: int) -> int | None:
    """How many pixels a 1x1 convolution's ``rows x columns`` output is computed as, in one row, by
    :func:`pixels_as_one_row` (None where it keeps its rows): where no part of a row and no whole rows hold whole
    8-lane vectors, the pixels padded to a multiple of :data:`CHANNEL_MULTIPLE` if that adds at most
    :data:`PIXEL_PADDING_SHARE` of them."""
    pixels, lanes = rows * columns, CHANNEL_MULTIPLE // 2
    padded = -(-pixels // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE
    if rows == 1 or any(r * columns % lanes == 0 for r in range(1, rows + 1) if rows % r == 0) \
            or padded - pixels > pixels * PIXEL_PADDING_SHARE:
        return None
    return padded


def in_one_row(kernel: Sequence[int], data: Sequence[int], out: Sequence[int]) -> bool:
    """Whether a 2-D convolution of a ``kernel`` window from ``data``'s spatial size to ``out``'s is one
    :func:`pixels_as_one_row` computes on its pixels as one row (a 1x1 window, stride 1, no padding, a size it takes)."""
    return list(kernel) == [1, 1] and list(data) == list(out) and row_of_pixels(*out) is not None


def _epilogue_above_row_reshape(mod: Any) -> tuple[Any, int]:
    """``mod`` and how many times it took ``op(reshape(x))`` as ``reshape(op(x))`` where the reshape takes a row of
    pixels (N, K, 1, H*W) back to (N, K, H, W) and ``op`` is a ReLU, a clip, or an add or multiply by a per-channel
    (1, K, 1, 1) tensor or by one of the reshape's shape (reshaped to a row too): each step of a convolution's
    epilogue (bias, activation, residual add) then stays fused with it, the reshape after them
    (:func:`pixels_as_one_row`)."""
    from tvm import relax
    from tvm.relax.dpl import is_op, wildcard

    inner, operand = wildcard(), wildcard()
    reshaped = is_op("relax.reshape")(inner, wildcard())
    # Relax's matcher takes an add's or a multiply's operands in either order: the other one is ``operand``'s match
    epilogue = (is_op("relax.nn.relu")(reshaped) | is_op("relax.clip")(reshaped, wildcard(), wildcard())
                | is_op("relax.add")(reshaped, operand) | is_op("relax.multiply")(reshaped, operand))
    moved = 0

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        nonlocal moved
        row, grid = _static_shape(matches[inner]), _static_shape(matches[reshaped])
        if row is None or grid is None or len(row) != 4 or len(grid) != 4 or row[:3] != [*grid[:2], 1]:
            return expr
        args = [matches[inner]]
        if expr.op.name in ("relax.add", "relax.multiply"):
            other = _static_shape(matches[operand])
            if other == grid:
                args.append(relax.op.reshape(matches[operand], row))
            elif other is not None and len(other) == 4 and other[2:] == [1, 1] and other[0] in (1, grid[0]) \
                    and other[1] in (1, grid[1]):
                args.append(matches[operand])
            else:
                return expr
        else:
            args += expr.args[1:]
        moved += 1
        return relax.op.reshape(relax.Call(expr.op, args, expr.attrs, expr.ty_args), grid)

    return rewrite_calls(mod, epilogue, rewrite), moved


def _static_shape(expr: Any) -> list[int] | None:
    """A Relax expression's shape where every dimension is a constant, else None."""
    from tvm import tirx

    shape = expr.ty.shape
    if shape is None or not all(isinstance(v, tirx.IntImm) for v in shape.values):
        return None
    return [int(v) for v in shape.values]


def _plain_float_conv(attrs: Any, weight: Any) -> bool:
    """A one-group NCHW/OIHW -> NCHW convolution by a float32 constant weight."""
    return (attrs.groups == 1 and weight.value.dtype == "float32"
            and (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NCHW", "OIHW", "NCHW"))


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
        if not _plain_float_conv(c, matches[weight]):
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
