"""Where a model's time goes, operator by operator, in our build beside its baselines': PyTorch eager's top-level
operators profiled with ``torch.profiler`` (shapes and arguments recorded), OpenVINO's layers by its own counters
(:mod:`.openvino_ops`), and our fused operators timed call by call inside the built model
(:meth:`~opbench.measure.measurer.Measurer.profile_models`), matched by what they compute (a convolution's or a
GEMM's sizes, a row-wise op's input). Every side is timed inside its model, where a weight comes from memory rather
than from the cache a lone operator's repeated calls keep it in. A diagnostic: its times are profiler times, never a
verified claim."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opbench.workloads._base import conv_out
from opbench.workloads.models.depth_unfold import DepthUnfold
from opbench.workloads.models.extract import FusedOp
from opbench.workloads.models.graph import CHANNEL_MULTIPLE, in_one_row
from opbench.workloads.models.sources import ModelSource
from opbench.workloads.models.subpixel import SubPixel, is_matmul

# ("conv", n, c, k, r, s, oh, ow): not the input's size, which a pad outside the convolution changes (eager's
# explicit padding; ours folded into the convolution; a 3-D one's depth-unfolded form) | ("conv3d", n, c, k, t, r, s, od, oh, ow) |
# ("conv_transpose", as "conv") | ("gemm", rows, n, k) |
# (kind, *shape)
Signature = tuple[Any, ...]
OTHER: Signature = ("other",)
ROWWISE = {"softmax", "layer_norm"}
# our convolution kinds: their signature's name, and the weight's axis of output channels (a transposed one's: 1)
CONVOLUTIONS = {"conv2d": ("conv", 0), "depthwise_conv2d": ("conv", 0), "conv3d": ("conv3d", 0),
                "conv2d_transpose": ("conv_transpose", 1)}


@dataclass(frozen=True)
class OpTime:
    """One group of operators computing the same thing: its signature and ms per run."""

    signature: Signature
    ms: float


@dataclass(frozen=True)
class Matched:
    """A signature's time in our build and in each baseline's (by name; NaN where a side has none), per model run."""

    signature: Signature
    ours_ms: float
    theirs_ms: dict[str, float]


def conv_signature(data: Sequence[int], weight: Sequence[int], stride: Sequence[int], padding: Sequence[int],
          dilation: Sequence[int], groups: int = 1) -> Signature:
    """("conv", n, c, k, kernel..., out...) of a 2-D convolution (a 1x1 one's pixels as one row where the model's
    import computes them so: :func:`~opbench.workloads.models.graph.pixels_as_one_row`); of a 3-D one, its
    depth-unfolded 2-D convolution's where the model's import rewrote it (:mod:`opbench.workloads.models.depth_unfold`), else ("conv3d", ...)."""
    n, c, *spatial = data
    k, _, *kernel = weight
    out = [conv_out(size, f, int(st), int(p), int(d)) for size, f, st, p, d in zip(spatial, kernel, stride, padding, dilation)]
    if len(spatial) == 2:
        one_row = groups == 1 and in_one_row(kernel, spatial, out)  # our import computes it on its pixels as one row
        return ("conv", n, c, k, *kernel, *([1, out[0] * out[1]] if one_row else out))
    if groups == 1:
        unfold = DepthUnfold.of(spatial[0], kernel[0], int(stride[0]), int(dilation[0]), (int(padding[0]), int(padding[0])))
        return ("conv", *unfold.conv_signature(n, c, k, (kernel[1], kernel[2]), (out[1], out[2])))
    return ("conv3d", n, c, k, *kernel, *out)


def conv_transpose_signature(data: Sequence[int], weight: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                    output_padding: Sequence[int], groups: int = 1, dilation: Sequence[int] = (1, 1)) -> Signature:
    """What our build computes for eager's transposed convolution: its sub-pixel form's convolution (or matrix
    product) where the model's import rewrote it (:mod:`opbench.workloads.models.subpixel`), else the transposed one."""
    n, c, h, w = data
    _, k, r, s = weight
    extra = (int(output_padding[0]), int(output_padding[1]))
    if groups == 1 and tuple(dilation) == (1, 1):
        if is_matmul((h, w), extra):
            return ("gemm", n, k * r * s, c)
        sub = SubPixel.of((h, w), (r, s), (int(stride[0]), int(stride[1])), (*padding, *padding), extra)  # type: ignore[arg-type]
        return ("conv", *sub.conv_signature(n, c, k))
    oh, ow = ((size - 1) * st - 2 * p + f + e for size, p, f, st, e in zip((h, w), padding, (r, s), stride, extra))
    return ("conv_transpose", n, c, k, r, s, oh, ow)


def eager_signature(name: str, shapes: Sequence[Sequence[int]], args: Sequence[Any]) -> Signature:
    """What a top-level ATen call computes (:data:`OTHER` when it is none of conv, GEMM, row-wise)."""
    op = name.removeprefix("aten::")
    if op == "conv_transpose2d" and len(shapes[1]) == 4:
        return conv_transpose_signature(shapes[0], shapes[1], *args[3:8])
    if op in ("conv2d", "conv3d", "convolution") and len(shapes[1]) in (4, 5):
        return conv_signature(shapes[0], shapes[1], args[3], args[4], args[5], args[-1] if isinstance(args[-1], int) else 1)
    if op == "linear":
        return ("gemm", math.prod(shapes[0][:-1]), shapes[1][0], shapes[0][-1])
    if op in ("matmul", "bmm", "mm") and len(shapes[0]) >= 2 and len(shapes[1]) >= 2:
        return ("gemm", math.prod(shapes[0][:-1]), shapes[1][-1], shapes[0][-1])
    if op == "addmm":
        return ("gemm", shapes[1][0], shapes[2][1], shapes[1][1])
    kind = {"softmax": "softmax", "_softmax": "softmax", "layer_norm": "layer_norm"}.get(op)
    return (kind, *shapes[0]) if kind else OTHER


def fused_signature(op: FusedOp) -> Signature:
    """What one of our fused operators computes, from its anchor kind and buffers (inputs, then output)."""
    out, first = op.shapes[-1], op.shapes[0]
    if op.kind in CONVOLUTIONS and len(first) == len(out) in (4, 5):
        name, out_channels_axis = CONVOLUTIONS[op.kind]  # of the weight
        weights = [s for s in op.shapes[1:-1] if len(s) == len(out)]
        weight = next((s for s in weights if s[out_channels_axis] == out[1]), None) or next(
            (s for s in weights if 0 < s[out_channels_axis] - out[1] < CHANNEL_MULTIPLE), None)  # padded, then cropped
        if weight is not None:
            spatial = out[2:]
            if in_one_row(weight[2:], first[2:], spatial):
                spatial = (1, spatial[0] * spatial[1])  # one the import kept in rows (int8): as conv_signature gives it
            return (name, *first[:2], out[1], *weight[2:], *spatial)
    if op.kind in ("matmul", "dense", "batch_matmul") and len(out) >= 2:
        return ("gemm", math.prod(out[:-1]), out[-1], first[-1])
    if op.kind in ROWWISE:
        return (op.kind, *first)
    return OTHER


def profile_eager(source: ModelSource, runs: int = 5, threads: int | None = None) -> list[OpTime]:
    """PyTorch eager's top-level operators over ``runs`` calls (after one warm-up), grouped by signature."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if threads:
        torch.set_num_threads(threads)
    with torch.no_grad():
        source.module(*source.inputs)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(runs):
                source.module(*source.inputs)
    total_us: dict[Signature, float] = defaultdict(float)
    for event in prof.events():
        if event.cpu_parent is None:  # a nested call is counted in its top-level caller
            signature = eager_signature(event.name, event.input_shapes, getattr(event, "concrete_inputs", None) or [])
            total_us[signature] += event.cpu_time_total
    return [OpTime(sig, us / 1e3 / runs) for sig, us in total_us.items()]


def ours(ops: Iterable[FusedOp], per_run_ms: dict[str, float]) -> list[OpTime]:
    """Our fused operators grouped by signature: ``per_run_ms`` per operator name, all its calls in a run."""
    ms: dict[Signature, float] = defaultdict(float)
    for op in ops:
        if op.name in per_run_ms:
            ms[fused_signature(op)] += per_run_ms[op.name]
    return [OpTime(sig, total) for sig, total in ms.items()]


def match(our_times: list[OpTime], baselines: dict[str, list[OpTime]]) -> list[Matched]:
    """Our build and each baseline by signature, the largest time of the first baseline first; what only some
    sides have stays NaN on the others; everything neither conv, GEMM nor row-wise is one :data:`OTHER` row, last."""
    mine = {t.signature: t.ms for t in our_times}
    theirs = {name: {t.signature: t.ms for t in times} for name, times in baselines.items()}
    signatures = {*mine}.union(*theirs.values())
    rows = [Matched(sig, mine.get(sig, math.nan), {name: ms.get(sig, math.nan) for name, ms in theirs.items()})
            for sig in signatures]
    first = next(iter(baselines), "")

    def largest_first(m: Matched) -> tuple[bool, float]:
        ms = m.theirs_ms.get(first, math.nan)
        return m.signature == OTHER, -(ms if ms == ms else 0)

    return sorted(rows, key=largest_first)
