"""A convolution of few input channels (a network's stem) on NCHW, vectorised along the output's width.

The packed direct schedule (:mod:`opbench.space.packed`) vectorises output channels: each tap is a broadcast data
value times a vector of weights, and its register tile is written back to NCHW a channel at a time; with 3 input
channels a 3x3 window gives an output 27 FMAs, too few to pay for that write-back. Here a register tile of
``columns_channels`` output channels x ``columns_rows`` rows x ``columns_vectors`` vectors along the width sums the
window, each tap a broadcast weight times a vector of an input row. The data is copied once, padded and split into
``stride`` column phases (phase ``p``'s column ``x`` is the padded input's ``x * stride + p``), so that each tap's
vector is contiguous in a strided convolution too (docs/workloads-and-templates.md#stem-columns)::

    data   (N, C, H+2p, W+2p) -> (N, C, stride, H+2p, (W+2p)/stride)   padding and phases done by the copy
    conv   n, channel tiles, row tiles (parallel) | column tiles | c | window | channels | rows | vectors | lanes
    write  the tile with the epilogue (bias, ReLU), vectorised
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Nest, divisors
from opbench.space._schedule import fold_into_write, vectorize_rows
from opbench.workloads import Workload
from opbench.workloads.fused import anchor_block, inline_side_blocks

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

KNOBS = ("columns_channels", "columns_rows", "columns_vectors")
CHANNELS_CAP = 16
ROWS_CAP = 4
VECTORS_CAP = 4
DEFAULT_CHANNELS = 8  # a tile's output channels by default (all of them up to CHANNELS_CAP)
WIDE_WINDOW = 49  # taps: the default up to a 7x7 window (the widest measured); wider ones (ViT's patches) direct


def _extents(workload: Workload) -> dict[str, int]:
    """From the anchor's loops (n, k, oh, ow | c, r, s) and the data's shape (N, C, H, W)."""
    spatial = [a.extent for a in workload.axes if not a.reduce]
    reduce = [a.extent for a in workload.axes if a.reduce]
    data = workload.op.input_shapes(workload.params)[0]
    return {"k": spatial[1], "oh": spatial[2], "ow": spatial[3], "c": reduce[0], "data_c": data[1],
            "window": math.prod(reduce[1:])}


def _width_vector(workload: Workload) -> int:
    """The vector along the output width: its largest power-of-two factor up to the CPU's lanes."""
    ow, lanes = _extents(workload)["ow"], current_shape().fp32_lanes
    return math.gcd(ow & -ow, lanes)


def applies(workload: Workload) -> bool:
    """A float32 convolution (not grouped) of fewer input channels than a vector's lanes, whose output rows are whole
    vectors of at least half the lanes."""
    ext, lanes = _extents(workload), current_shape().fp32_lanes
    return (workload.dtype == "float32" and ext["c"] == ext["data_c"] < lanes and ext["window"] > 1
            and _width_vector(workload) >= lanes // 2)


def knobs(workload: Workload) -> list[Knob]:
    ext, vector = _extents(workload), _width_vector(workload)
    channels, rows, vectors = KNOBS
    return [Knob(channels, divisors(ext["k"], CHANNELS_CAP), f"output channels of a register tile ({ext['k']})"),
            Knob(rows, divisors(ext["oh"], ROWS_CAP), f"output rows of a register tile ({ext['oh']})"),
            Knob(vectors, divisors(ext["ow"] // vector, VECTORS_CAP),
                 f"vectors of {vector} columns along the width in a register tile ({ext['ow']} columns)")]


def default_config(workload: Workload) -> Config:
    """One row of one vector by every output channel up to :data:`CHANNELS_CAP` (each data vector read once), else
    by up to :data:`DEFAULT_CHANNELS`."""
    channels, rows, vectors = KNOBS
    k = _extents(workload)["k"]
    return {channels: k if k <= CHANNELS_CAP else divisors(k, DEFAULT_CHANNELS)[-1], rows: 1, vectors: 1}


def preferred(workload: Workload) -> bool:
    """The default on vectors of all the CPU's lanes, up to a :data:`WIDE_WINDOW`-tap window: ResNet3D-18's
    depth-unfolded stem (9 channels, 7x7, rows of 56: vectors of 8) stayed faster direct
    (docs/workloads-and-templates.md#stem-columns)."""
    return _width_vector(workload) == current_shape().fp32_lanes and _extents(workload)["window"] <= WIDE_WINDOW


def nest(config: Config, workload: Workload) -> Nest:
    """The register tile: channels x rows x the vectors' columns; the reduction: channels x window; parallel over
    the batch, the channel tiles and the row tiles."""
    ext, (channels, rows, vectors) = _extents(workload), (config[k] for k in KNOBS)
    vector = _width_vector(workload)
    return Nest((channels, rows, vectors * vector), vector, ext["c"] * ext["window"],
                workload.axes[0].extent * ext["k"] // channels * ext["oh"] // rows)


def apply(sch: Schedule, config: Config, workload: Workload, layout_transform: str) -> None:
    """Schedule the data's padded, phase-split copy and the anchor by register tiles (its epilogue folded into the
    tile's write-back); the weight is read as it lies, so ``layout_transform`` changes nothing."""
    channels, rows, vectors = (config[k] for k in KNOBS)
    vector = _width_vector(workload)
    conv = anchor_block(sch)
    epilogue = inline_side_blocks(sch, conv)
    _phase_split_data(sch, conv, _stride(sch, conv))
    n, k, y, x, c, *window = sch.get_loops(conv)
    ko, ki = sch.split(k, [None, channels])
    yo, yi = sch.split(y, [None, rows])
    xo, xv, xi = sch.split(x, [None, vectors, vector])
    sch.reorder(n, ko, yo, xo, c, *window, ki, yi, xv, xi)
    accumulator = sch.cache_write(conv, 0, "local")
    fold_into_write(sch, epilogue)
    sch.reverse_compute_at(accumulator, xo)
    sch.parallel(sch.fuse(n, ko, yo))
    for loop in (*window, ki, yi, xv):
        sch.unroll(loop)
    sch.vectorize(xi)
    init = sch.decompose_reduction(conv, c)
    vectorize_rows(sch, init, vector)
    vectorize_rows(sch, accumulator, vector)


def _stride(sch: Schedule, conv: Any) -> int:
    """The convolution's stride along the width: from the width it reads (padded) and the one it writes."""
    block = sch.get(conv)
    read, ow = int(block.reads[0].source.shape[3]), int(block.writes[0].source.shape[3])
    window = int(block.reads[1].source.shape[3])
    return max(1, (read - window) // (ow - 1)) if ow > 1 else 1


def _phase_split_data(sch: Schedule, conv: Any, stride: int) -> None:
    """The data copied once, its padding inlined, into ``stride`` column phases; parallel over its rows, in the
    phases' order (stores contiguous, the loads strided). A width that is no multiple of the stride is padded (TVM
    then iterates the copy in the phases' order itself)."""
    prologue = sch.get_producers(conv)
    copy = sch.cache_read(conv, 0, "global")
    width = int(sch.get(copy).writes[0].source.shape[3])
    sch.transform_layout(conv, ("read", 0), lambda n, c, h, w: (n, c, w % stride, h, w // stride),
                         pad_value=None if width % stride == 0 else 0.0)
    for block in prologue:
        sch.compute_inline(block)
    loops = sch.get_loops(copy)
    if len(loops) == 4:
        n, c, h, w = loops
        wo, phase = sch.split(w, [None, stride])
        sch.reorder(n, c, phase, h, wo)
        loops = [n, c, phase, h, wo]
    sch.parallel(sch.fuse(*loops[:4]))
