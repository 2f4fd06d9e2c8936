"""A 1x1 convolution (stride 1, no padding) as the GEMM it is on NCHW: ``out[k, p] = sum_c w[k, c] x[c, p]``
over the ``p = y * W + x`` output pixels, with no layout transform of the activations.

The direct packed schedule (:mod:`opbench.space.packed`) copies the data to NCHW[x]c and writes its packed
accumulator back to NCHW a channel vector at a time; here the data is read where it lies, its pixels the
vectorised loop, and the output (with the epilogue: batch norm, residual add, ReLU) is written in
contiguous runs of whole rows (docs/workloads-and-templates.md#pointwise-gemm)::

    weight (K, C, 1, 1) -> (K/rows, C, 1, 1, rows)   a register tile's weights adjacent (packed once by a model)
    conv   n | outer: K/rows and pixel tiles (order) | C chunks | C in chunk | rows | pixel vectors | lanes
    conv   n | pixel tiles, K panels | C chunks | K/rows in the panel | C in chunk | rows | ...   (chunks_outer)

With ``chunks_outer`` each chunk of a pixel tile's data stays in L1 while every output-channel tile of a panel
reads it, the tiles' sums kept in a buffer of the panel's outputs between chunks; with the other two orders a
tile's whole reduction runs at once, so every tile reads all of the pixel tile's data (from L2 where it exceeds L1).

A pixel tile is whole output rows, or a part of one row that divides it: TVM's region of a tile
that crosses rows partway is the rectangle around it, so the write-back would cover pixels the tile did not
compute (wrong results, seen with 32- and 64-pixel tiles on 56x56).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Nest, divisors
from opbench.space._schedule import IN_OP, fold_into_write, loops_below, mark_prepack, pack_copy
from opbench.workloads import Workload
from opbench.workloads._base import numpy_dtype
from opbench.workloads.fused import anchor_block, blocks_after

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

KNOBS = ("gemm_pixels", "gemm_rows", "gemm_reduce", "gemm_order")
PIXELS_CAP = 256  # pixels of a register tile: its accumulators are rows x pixels / lanes vectors
ROWS_CAP = 16
REDUCE_CAP = 64
ORDERS = ("channels_outer", "pixels_outer", "chunks_outer")  # the outer loops' order (above)
STREAMING_REDUCE_VECTORS = 2  # input channels, in vectors' lanes, up to which an output's FMAs are few (above)
PARALLEL_TILES = 16  # chunks_outer cuts the output channels into panels until the parallel loop has this many


def _extents(workload: Workload) -> dict[str, int]:
    """From the anchor's loops (n, k, oh, ow | c, r, s) and the data's shape (N, C, H, W)."""
    spatial = [a.extent for a in workload.axes if not a.reduce]
    reduce = [a.extent for a in workload.axes if a.reduce]
    data = workload.op.input_shapes(workload.params)[0]
    return {"k": spatial[1], "oh": spatial[2], "ow": spatial[3], "c": reduce[0], "window": math.prod(reduce[1:]),
            "h": data[2], "w": data[3]}


def pixel_tiles(oh: int, ow: int, lanes: int) -> tuple[int, ...]:
    """Pixel tiles of whole vectors that are a divisor of one row, or whole rows (a divisor of the row count)."""
    parts = {t for t in divisors(ow) if t % lanes == 0}
    rows = {r * ow for r in divisors(oh) if r * ow % lanes == 0}
    return tuple(sorted(t for t in parts | rows if t <= PIXELS_CAP))


def applies(workload: Workload) -> bool:
    """A 1x1 convolution whose output has the data's height and width (stride 1, no padding) and whose pixels
    tile into whole vectors of the CPU's lanes."""
    ext = _extents(workload)
    return (ext["window"] == 1 and (ext["oh"], ext["ow"]) == (ext["h"], ext["w"])
            and bool(pixel_tiles(ext["oh"], ext["ow"], current_shape().fp32_lanes)))


def knobs(workload: Workload) -> list[Knob]:
    ext = _extents(workload)
    pixels, rows, reduce, order = KNOBS
    return [
        Knob(pixels, pixel_tiles(ext["oh"], ext["ow"], current_shape().fp32_lanes),
             f"output pixels per register tile (the vectorised loop; {ext['oh']}x{ext['ow']} pixels)"),
        Knob(rows, divisors(ext["k"], ROWS_CAP), f"output channels per register tile ({ext['k']})"),
        Knob(reduce, divisors(ext["c"], REDUCE_CAP), f"input channels per reduction chunk ({ext['c']})"),
        Knob(order, ORDERS, "the outer loops' order: output-channel tiles outside pixel tiles, or inside, or the "
                            "reduction chunks outside the output-channel tiles of a panel"),
    ]


def default_config(workload: Workload) -> Config:
    """The register tile (pixels, output channels) with the most FMAs per load among those that fit the CPU's
    accumulator registers (:func:`~opbench.hardware.cpu_shape.current_shape`; each step loads its pixel vectors
    and broadcasts its weights), the reduction in chunks of up to 64 input channels, pixel tiles outside (a tile's
    data stays in cache while every output-channel tile reads it); where the input channels take more than one
    chunk, the chunks outside the output-channel tiles (``chunks_outer``: a chunk stays in L1). Where the output
    streams to memory (:func:`_streams_to_memory`), the output-channel tiles
    outside (``channels_outer``: each writes its channels' planes in turn, not every plane a few vectors at a time),
    and the tile as tall as the registers beside its pixel vectors allow (fewer passes over the data;
    docs/workloads-and-templates.md#pointwise-gemm has the measurements)."""
    ext, shape = _extents(workload), current_shape()
    lanes = shape.fp32_lanes
    streams = _streams_to_memory(workload)
    widths = [pixels // lanes for pixels in pixel_tiles(ext["oh"], ext["ow"], lanes)]
    tiles = [(vectors, rows) for vectors in widths for rows in divisors(ext["k"], ROWS_CAP)
             if vectors * rows <= (shape.accumulators_beside(vectors + 1) if streams else shape.accumulator_registers)]
    vectors, rows = max(tiles or [(widths[0], 1)], key=lambda t: (t[0] * t[1] / (t[0] + t[1]), t[0] * t[1]))
    reduce = divisors(ext["c"], REDUCE_CAP)[-1]
    order = "channels_outer" if streams else "chunks_outer" if ext["c"] > reduce else "pixels_outer"
    return {"gemm_pixels": vectors * lanes, "gemm_rows": rows, "gemm_reduce": reduce, "gemm_order": order}


def _streams_to_memory(workload: Workload) -> bool:
    """Whether the output is what the operator's time goes to: larger than half the CPU's last-level cache (which holds
    the model's other tensors too), each output a reduction of at most :data:`STREAMING_REDUCE_VECTORS` vectors' lanes
    (a longer one is the FMAs' time: ResNet-50's 64 input channels at batch 16 ran 13% slower channels outside), and
    one image's data in L2 (read again by every output-channel tile)."""
    ext, shape, size = _extents(workload), current_shape(), numpy_dtype(workload.dtype).itemsize
    output = workload.axes[0].extent * ext["k"] * ext["oh"] * ext["ow"] * size
    return (output > shape.l3_kb * 512 and ext["c"] <= STREAMING_REDUCE_VECTORS * shape.fp32_lanes
            and ext["c"] * ext["h"] * ext["w"] * size <= shape.l2_kb * 1024)


def nest(config: Config, workload: Workload) -> Nest:
    """The register tile: output channels x pixels (vectors of the CPU's lanes); the reduction chunk; parallel
    over every (output-channel tile, pixel tile), or with ``chunks_outer`` every (pixel tile, panel)."""
    pixels, rows = config["gemm_pixels"], config["gemm_rows"]
    across = _panels(workload, rows, pixels) if config["gemm_order"] == "chunks_outer" else _extents(workload)["k"] // rows
    return Nest((rows, pixels), current_shape().fp32_lanes, config["gemm_reduce"],
                _pixel_tiles(workload, pixels) * across)


def apply(sch: Schedule, config: Config, workload: Workload, layout_transform: str) -> None:
    """Schedule the anchor (and its epilogue) as the GEMM; the weight's packing is marked as a layout rewrite
    (a model's runs once at build time) unless ``layout_transform`` is :data:`IN_OP` (timed in the operator)."""
    lanes = current_shape().fp32_lanes
    pixels, rows = config["gemm_pixels"], config["gemm_rows"]
    conv = anchor_block(sch)
    epilogue = blocks_after(sch, conv)
    for block in sch.get_producers(conv):
        sch.compute_inline(block)
    weight = sch.cache_read(conv, 1, "global")
    sch.transform_layout(conv, ("read", 1), lambda o, i, r, s: (o // rows, i, r, s, o % rows))
    n, k, y, x, c, r, s = sch.get_loops(conv)
    ko, ki = sch.split(k, [None, rows])
    po, pv, lane = _split_pixels(sch, y, x, pixels, lanes, _extents(workload)["ow"])
    co, ci = sch.split(c, [None, config["gemm_reduce"]])
    if config["gemm_order"] == "chunks_outer":
        kp, ko = sch.split(ko, [_panels(workload, rows, pixels), None])
        outer = [n, po, kp]
        sch.reorder(n, po, kp, co, ko, r, s, ci, ki, pv, lane)
    else:
        outer = [n, ko, po] if config["gemm_order"] == "channels_outer" else [n, po, ko]
        sch.reorder(*outer, co, r, s, ci, ki, pv, lane)
    # global: TVM puts a global buffer under 1 KB on the stack, where LLVM keeps it in registers; a local one is
    # taken from the workspace pool each time its loop is entered, here every tile (#pointwise-gemm)
    accumulator = sch.cache_write(conv, 0, "global")
    fold_into_write(sch, epilogue)  # into the write-back of each tile
    sch.reverse_compute_at(accumulator, outer[-1])
    tiles = sch.fuse(*outer)
    sch.parallel(tiles)
    sch.unroll(ki)
    sch.unroll(pv)
    sch.vectorize(lane)
    init = sch.decompose_reduction(conv, co)
    sch.vectorize(sch.get_loops(init)[-1])
    over_rows = rows > 1 or config["gemm_order"] == "chunks_outer"  # a loop over the channels written, not fused
    _write_back(sch, loops_below(sch, accumulator, tiles)[1 if over_rows else 0:], lanes)
    pack_copy(sch, weight, {0: rows}, (0, 2, 3, 4, 1), parallel=1)
    if layout_transform != IN_OP:
        mark_prepack(sch, weight)


def _split_pixels(sch: Schedule, y: Any, x: Any, pixels: int, lanes: int, width: int) -> tuple[Any, Any, Any]:
    """The output pixels as (tiles, vectors of a tile, lanes). A tile that is part of a row splits the row alone,
    the rows outside it: split from the fused rows and columns, TVM bounds the accumulator a tile writes by every
    pixel from the first to the last row the fused index could reach, not by its own pixels (#pointwise-gemm in
    docs/workloads-and-templates.md). A tile of whole rows splits the rows, which is exact."""
    if pixels <= width:
        xo, pv, lane = sch.split(x, [None, pixels // lanes, lanes])
        return sch.fuse(y, xo), pv, lane
    yo, yi = sch.split(y, [None, pixels // width])
    pv, lane = sch.split(sch.fuse(yi, x), [None, lanes])
    return yo, pv, lane


def _panels(workload: Workload, rows: int, pixels: int) -> int:
    """Into how many panels ``chunks_outer`` cuts the output channels, so that the parallel loop has at least
    :data:`PARALLEL_TILES` iterations (pixel tiles x panels): the fewest that do, else one per register tile."""
    counts, tiles = divisors(_extents(workload)["k"] // rows), _pixel_tiles(workload, pixels)
    return next((p for p in counts if tiles * p >= PARALLEL_TILES), counts[-1])


def _pixel_tiles(workload: Workload, pixels: int) -> int:
    """How many pixel tiles of ``pixels`` cover the output (over the batch)."""
    ext = _extents(workload)
    return workload.axes[0].extent * ext["oh"] * ext["ow"] // pixels


def _write_back(sch: Schedule, pixel_loops: list[Any], lanes: int) -> None:
    """A tile's write-back (the epilogue inlined into it): its pixel loops (the tile's rows, where it has more
    than one, and columns) fused, in vectors of ``lanes``."""
    pixels = sch.fuse(*pixel_loops) if len(pixel_loops) > 1 else pixel_loops[0]
    outer, lane = sch.split(pixels, [None, lanes])
    sch.unroll(outer)
    sch.vectorize(lane)


def preferred(workload: Workload) -> bool:
    """The default wherever it applies: its default beat the direct one on every ResNet-50 and MobileNetV2 1x1
    convolution it applies to (docs/workloads-and-templates.md#pointwise-gemm)."""
    return True
