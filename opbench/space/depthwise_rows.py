"""A depthwise convolution ("same" padding, stride 1 or 2) on NCHW as it lies: each channel's padded plane built
once, the output's rows vectorised along the width, with no layout transform of the activations.

The direct packed schedule (:mod:`opbench.space.packed`) copies the data to NCHW[c]c, a transposing pass over it, for
9 FMAs an output; here a channel's padded plane is zeros and then its rows copied in (contiguous), and a register tile
of ``rows_tile`` output rows sums the window from it, each tap a broadcast weight times a vector of the padded row
read at the tap's offset. At stride 2 the plane is split into two column phases as it is copied (phase ``p``'s
column ``x`` is the padded row's ``2x + p``), so that each tap's vector is contiguous there too
(docs/workloads-and-templates.md#depthwise-rows)::

    pad    n, c (parallel) | zeros; interior rows, vectorised            (the channel's plane, in cache)
    conv   n, c (parallel) | row tiles | window (unrolled) | rows | width vectors | lanes
    write  the tile's rows with the epilogue (bias, clip), vectorised
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Nest, divisors
from opbench.space._schedule import fold_into_write, padded_planes, vector_lanes, vectorize_rows
from opbench.workloads import Workload
from opbench.workloads.fused import anchor_block, inline_side_blocks

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

KNOBS = ("rows_tile",)
ROWS_CAP = 8
STRIDES = (1, 2)
SMALL_WINDOW = 9  # taps: a 3x3 window's 9 FMAs an output do not pay for the packed schedule's two layout passes


def _extents(workload: Workload) -> dict[str, int]:
    """From the anchor's loops (n, c, oh, ow | [1,] r, s) and the data's shape (N, C, H, W)."""
    spatial = [a.extent for a in workload.axes if not a.reduce]
    reduce = [a.extent for a in workload.axes if a.reduce]
    data = workload.op.input_shapes(workload.params)[0]
    return {"c": spatial[1], "oh": spatial[2], "ow": spatial[3], "window": math.prod(reduce), "h": data[2], "w": data[3],
            "r": reduce[-2], "s": reduce[-1]}


def _stride(ext: dict[str, int]) -> int:
    """The stride, 1 or 2, at which the output covers the data ("same" padding); 0 for any other output."""
    return next((s for s in STRIDES if (ext["oh"], ext["ow"]) == (-(-ext["h"] // s), -(-ext["w"] // s))), 0)


def applies(workload: Workload) -> bool:
    """A depthwise convolution of an odd window with "same" padding: stride 1, or 2 over a window of at least 3x3
    (so that the operator pads, and the plane is built by its padding stage)."""
    ext = _extents(workload)
    stride = _stride(ext)
    return (stride > 0 and ext["r"] % 2 == 1 and ext["s"] % 2 == 1
            and (stride == 1 or min(ext["r"], ext["s"]) > 1))


def _width_vector(workload: Workload) -> int:
    """The vector along the output width: :func:`~opbench.space._schedule.vector_lanes`' (all of it where at most a
    register wide, else its largest power-of-two factor up to the CPU's lanes), or the whole row where that factor
    is under half a register and the row fits two (14 columns on AVX2: one vector of 14 lanes, two registers, not
    seven of two lanes)."""
    lanes, width = current_shape().fp32_lanes, _extents(workload)["ow"]
    vector = vector_lanes(width, lanes)
    return width if vector < lanes // 2 and width <= 2 * lanes else vector


def knobs(workload: Workload) -> list[Knob]:
    ext = _extents(workload)
    return [Knob(KNOBS[0], divisors(ext["oh"], ROWS_CAP), f"output rows per register tile ({ext['oh']} rows of "
                                                         f"{ext['ow']})")]


def default_config(workload: Workload) -> Config:
    """The most rows whose registers fit half the accumulator registers (a quarter of the CPU's vector registers), at
    least one; a vector wider than a register counts the registers it takes (28 columns on AVX-512: two a row, four
    rows) (docs/workloads-and-templates.md#depthwise-rows has the measurements)."""
    ext, shape = _extents(workload), current_shape()
    vector = _width_vector(workload)
    registers = ext["ow"] // vector * -(-vector // shape.fp32_lanes)
    fits = [r for r in divisors(ext["oh"], ROWS_CAP) if r * registers <= shape.accumulator_registers // 2]
    return {KNOBS[0]: fits[-1] if fits else 1}


def nest(config: Config, workload: Workload) -> Nest:
    """The register tile: rows x the width (vectors of :func:`_width_vector`); the window; parallel over channels."""
    ext = _extents(workload)
    return Nest((config[KNOBS[0]], ext["ow"]), _width_vector(workload), ext["window"],
                workload.axes[0].extent * ext["c"])


def apply(sch: Schedule, config: Config, workload: Workload, layout_transform: str) -> None:
    """Schedule the padding as a per-channel plane and the anchor (its epilogue folded into the tile's write-back)
    as row tiles; nothing is packed, so ``layout_transform`` changes nothing."""
    vector = _width_vector(workload)
    conv = anchor_block(sch)
    epilogue = inline_side_blocks(sch, conv)
    padding = sch.get_producers(conv)
    n, c, y, x, *window = sch.get_loops(conv)
    yo, yi = sch.split(y, [None, config[KNOBS[0]]])
    xo, xi = sch.split(x, [None, vector])
    sch.reorder(n, c, yo, *window, yi, xo, xi)
    accumulator = sch.cache_write(conv, 0, "local")
    fold_into_write(sch, epilogue)
    sch.reverse_compute_at(accumulator, yo)
    channels = sch.fuse(n, c)
    sch.parallel(channels)
    for loop in (*window, yi, xo):
        sch.unroll(loop)
    sch.vectorize(xi)
    init = sch.decompose_reduction(conv, window[0])
    vectorize_rows(sch, init, vector)
    vectorize_rows(sch, accumulator, vector)
    stride = _stride(_extents(workload))
    if stride == 1:
        padded_planes(sch, padding, channels)
    else:
        _phase_planes(sch, padding, channels, stride)


def _phase_planes(sch: Schedule, padding: list[Any], loop: Any, stride: int) -> None:
    """Each padding stage's plane computed at ``loop`` (:func:`~opbench.space._schedule.padded_planes`), the one the
    convolution reads split into ``stride`` column phases, its rows copied a group of ``stride`` columns at a time
    (each group's loads contiguous: LLVM's loop vectoriser turns them into vector loads and shuffles; TVM's own
    vectors of strided loads, one lane at a time, ran 30% slower on one thread). Where the padded width divides
    into the phases, the plane's zeros are stored phase by phase in vectors and its interior copied without a
    condition. Where it does not (TensorFlow's padding, one column on the right: every stride-2 depthwise
    convolution of a PyTorch MobileNetV2 as TVM imports it), the last phase is a column short: the split is made
    before the plane moves into ``loop``, so that the plane's own block writes that column's zeros (made after,
    they are a block over every channel, and the plane a buffer of every channel's planes)."""
    *earlier, plane = padding
    padded_planes(sch, earlier, loop)
    width = int(sch.get(plane).writes[0].source.shape[3])

    def split_phases(pad_value: float | None) -> None:
        sch.transform_layout(plane, ("write", 0), lambda n, c, h, w: (n, c, w % stride, h, w // stride),
                             pad_value=pad_value)

    if width % stride:
        split_phases(0.0)  # the short phase's last column, one no tap reads
        sch.compute_at(plane, loop)
        phase, rows, columns = sch.get_loops(plane)[-3:]
        sch.reorder(rows, columns, phase)
        sch.unroll(phase)
        return
    sch.compute_at(plane, loop)
    zeros = sch.decompose_padding(plane, sch.get_loops(plane)[-2])
    split_phases(None)
    rows, columns = sch.get_loops(zeros)[-2:]
    groups, phase = sch.split(columns, [None, stride])
    sch.reorder(phase, rows, groups)
    sch.vectorize(groups)
    sch.unroll(sch.split(sch.get_loops(plane)[-1], [None, stride])[1])


def preferred(workload: Workload) -> bool:
    """The default for a window of at most :data:`SMALL_WINDOW` taps, at stride 2 or on rows wider than half a vector
    register: at stride 1 a 7-wide row's 7-lane vectors and a 7x7 window's 49 unaligned loads a vector lost to the
    packed direct schedule (docs/workloads-and-templates.md#depthwise-rows)."""
    ext = _extents(workload)
    return ext["window"] <= SMALL_WINDOW and (_stride(ext) == 2 or ext["ow"] > current_shape().fp32_lanes // 2)
