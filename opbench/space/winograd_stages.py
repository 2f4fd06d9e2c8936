"""Winograd F(m x m, 3 x 3) (Lavin & Gray 2016): its tensor expressions and their schedule, shared by a
catalogue conv2d (:mod:`opbench.space.winograd`) and a model's fused one (:mod:`opbench.space.winograd_fused`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, divisors
from opbench.space._schedule import loops_below, mark_prepack

if TYPE_CHECKING:
    from tvm import IRModule

TILES = (2, 4)  # m: F(2x2, 3x3) is the more accurate, F(4x4, 3x3) the fewer multiplications


@dataclass(frozen=True)
class ConvShape:
    """A 3x3 stride-1 convolution's sizes: data (n, c, h, w), weight (k, c, 3, 3), output (n, k, oh, ow)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    pad: int
    oh: int
    ow: int


def lanes(extent: int) -> int:
    """The widest vector of the CPU's float32 lanes that divides ``extent``."""
    return divisors(extent, current_shape().fp32_lanes)[-1]


def tile_count(shape: ConvShape, m: int) -> int:
    """How many ``m x m`` output tiles cover the output (over the batch)."""
    return shape.n * math.ceil(shape.oh / m) * math.ceil(shape.ow / m)


def stages(data: Any, weight: Any, shape: ConvShape, m: int, prepacked: bool) -> Any:
    """The Winograd stages from ``data`` to the inverse transform, and the output at ``(n, k, y, x)`` as a
    function of those indices. ``prepacked``: the weight's transform is one stage reading the weight alone,
    marked to be split off and run once (a model's constant weight); else a stage per 1-D pass."""
    from tvm import te, tirx
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    c_, k_, pad = shape.c, shape.k, shape.pad
    a, nh, nw, cb = m + 2, math.ceil(shape.oh / m), math.ceil(shape.ow / m), lanes(c_)
    tiles = tile_count(shape, m)
    A, B, G = winograd_transform_matrices(m, 3, "float32")
    zero = tirx.const(0.0, "float32")
    packed = te.compute((shape.n, c_ // cb, nh * m + 2, nw * m + 2, cb), lambda n, co, y, x, ci: tirx.if_then_else(
        tirx.all(y >= pad, y < shape.h + pad, x >= pad, x < shape.w + pad), data[n, co * cb + ci, y - pad, x - pad],
        zero), name="data_pack")
    r, s = te.reduce_axis((0, 3), "r"), te.reduce_axis((0, 3), "s")
    if prepacked:
        u = te.compute((a, a, c_, k_), lambda e, v, c, k: te.sum(G[e, r] * weight[k, c, r, s] * G[v, s], axis=[r, s]),
                       name="kernel_transform")
    else:
        kernel_rows = te.compute((a, 3, c_, k_), lambda e, j, c, k: te.sum(weight[k, c, r, j] * G[e, r], axis=r),
                                 name="kernel_rows")
        u = te.compute((a, a, c_, k_), lambda e, v, c, k: te.sum(kernel_rows[e, s, c, k] * G[v, s], axis=s),
                       name="kernel_transform")

    def patch(t: Any, c: Any, dy: Any, dx: Any) -> Any:
        return packed[t // (nh * nw), c // cb, t // nw % nh * m + dy, t % nw * m + dx, c % cb]

    r1, r2 = te.reduce_axis((0, a), "r1"), te.reduce_axis((0, a), "r2")
    rows = te.compute((a, a, tiles, c_), lambda e, x, t, c: te.sum(patch(t, c, r1, x) * B[r1, e], axis=r1),
                      name="input_rows")
    v = te.compute((a, a, tiles, c_), lambda e, f, t, c: te.sum(rows[e, r2, t, c] * B[r2, f], axis=r2),
                   name="input_transform")
    rc = te.reduce_axis((0, c_), "rc")
    gemm = te.compute((a, a, tiles, k_), lambda e, f, t, k: te.sum(v[e, f, t, rc] * u[e, f, rc, k], axis=rc),
                      name="batch_gemm")
    a1, a2 = te.reduce_axis((0, a), "a1"), te.reduce_axis((0, a), "a2")
    cols = te.compute((a, m, tiles, k_), lambda e, j, t, k: te.sum(gemm[e, a2, t, k] * A[a2, j], axis=a2),
                      name="inverse_cols")
    inverse = te.compute((tiles, m, m, k_), lambda t, i, j, k: te.sum(A[a1, i] * cols[a1, j, t, k], axis=a1),
                         name="inverse_transform")
    return lambda i: inverse[(i[0] * nh + i[2] // m) * nw + i[3] // m, i[2] % m, i[3] % m, i[1]]


def schedule(mod: IRModule, config: Config, shape: ConvShape, prepacked: bool) -> IRModule:
    """The Winograd PrimFunc ``mod`` (:func:`stages`) scheduled by ``config``'s ``winograd_*`` knobs."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    for name in ("A", "B", "G"):  # the transform matrices: constants folded into the unrolled passes
        sch.compute_inline(sch.get_sblock(name))
    cb, kb = lanes(shape.c), lanes(shape.k)

    pack = sch.get_sblock("data_pack")
    n, co, y, _, ci = sch.get_loops(pack)
    sch.parallel(sch.fuse(n, co, y))
    sch.vectorize(ci)

    # per block of tiles only with the weight transformed once (in the op it is, per output-channel block)
    block = config.get("winograd_block", 0) if prepacked else 0
    tiles_outer = _gemm(sch, config, shape, block, prepacked)

    # input: per (tile, channel block), rows then columns of the patch, all in registers
    # (a block of more tiles than there are: as many as there are, the block loop of one iteration)
    m = config["winograd_tile"]
    a, per_block = m + 2, min(block * config["winograd_rows"], tile_count(shape, m))
    second = sch.get_sblock("input_transform")
    if block:
        sch.compute_at(second, tiles_outer)
        e, f, t, c, r2 = _loops(sch, second, tiles_outer, (a, a, per_block, shape.c, a))
    else:
        e, f, t, c, r2 = sch.get_loops(second)
    _two_pass(sch, second, "input_rows", t, (e, f), c, r2, cb, parallel=not block)

    # inverse: per (tile, output-channel block), columns then rows, in registers
    second = sch.get_sblock("inverse_transform")
    if block:
        sch.reverse_compute_at(sch.get_sblock("inverse_cols"), tiles_outer)
        sch.reverse_compute_at(second, tiles_outer)
        t, i, j, k, a1 = _loops(sch, second, tiles_outer, (per_block, a - 2, a - 2, shape.k, a))
    else:
        t, i, j, k, a1 = sch.get_loops(second)
    _two_pass(sch, second, "inverse_cols", t, (i, j), k, a1, kb, parallel=not block)

    n, k, _, _ = sch.get_loops(sch.get_sblock("output"))
    sch.parallel(sch.fuse(n, k))
    return sch.mod


def _gemm(sch: Any, config: Config, shape: ConvShape, block: int, prepacked: bool) -> Any:
    """The batched GEMM per output-channel block (parallel), each block's weight transformed just before it unless
    ``prepacked`` (then marked to be computed once); or, with ``block``, per block of that many register-tile steps
    of tiles (parallel). Returns the loop over those blocks of tiles (None without), where their transforms go."""
    gemm = sch.get_sblock("batch_gemm")
    e, f, t, k, rc = sch.get_loops(gemm)
    batch = sch.fuse(e, f)
    tiles_outer, t = sch.split(t, [None, block * config["winograd_rows"]]) if block else (None, t)
    to, ti = sch.split(t, [None, config["winograd_rows"]])
    ko, ki = sch.split(k, [None, config["winograd_cols"]])
    rco, rci = sch.split(rc, [None, config["winograd_reduce"]])
    sch.reorder(*[loop for loop in (tiles_outer, ko, batch, to, rco, rci, ti, ki) if loop is not None])
    accumulator = sch.cache_write(gemm, 0, "local")
    sch.reverse_compute_at(accumulator, to)
    sch.parallel(tiles_outer if block else ko)
    sch.unroll(ti)
    kio, kii = sch.split(ki, [None, lanes(config["winograd_cols"])])
    sch.unroll(kio)
    sch.vectorize(kii)
    _vectorize_init(sch, gemm, rco, to)
    _vectorize_innermost(sch, accumulator, to)
    if prepacked:
        mark_prepack(sch, sch.get_sblock("kernel_transform"))
    else:
        _kernel_transform(sch, ko, config["winograd_tile"] + 2, shape.c, config["winograd_cols"])
    return tiles_outer


def _kernel_transform(sch: Any, block_loop: Any, a: int, channels: int, cols: int) -> None:
    """The weight's transform for the output-channel block of ``block_loop``, input channel by input
    channel (the block laid out channel-major, so one channel's ``a x a`` vectors are adjacent): the
    3 x 3 weights of a vector of output channels gathered into registers, transformed by rows, then by
    columns into registers, then stored."""
    width = lanes(cols)
    kernel = sch.get_sblock("kernel_transform")
    sch.compute_at(kernel, block_loop)
    sch.transform_layout(kernel, ("write", 0), lambda e, v, c, k: (c, e, v, k))
    e, v, c, k, s = _loops(sch, kernel, block_loop, (a, a, channels, cols, 3))
    outer, inner = sch.split(k, [None, width]) if cols > width else (None, k)
    at = next(loop for loop in (outer, c, block_loop) if loop is not None)  # body: one vector, one input channel
    _in_registers(sch, (e, v, s), inner, outside=(c, outer))
    written = sch.cache_write(kernel, 0, "local")
    if at is not block_loop:  # (else it is there already)
        sch.reverse_compute_at(written, at)
    e2, v2, k2 = _loops(sch, written, at, (a, a, width))
    _in_registers(sch, (e2, v2), k2)
    _vectorize_init(sch, kernel, e, block_loop)

    rows = sch.get_sblock("kernel_rows")
    sch.set_scope(rows, 0, "local")
    sch.compute_at(rows, at)
    e, j, _, k, r = _loops(sch, rows, at, (a, 3, 1, width, 3))
    _in_registers(sch, (e, j, r), k)
    _vectorize_init(sch, rows, r, at)

    weights = sch.cache_read(rows, "weight", "local")
    sch.compute_at(weights, at)
    sch.transform_layout(weights, ("write", 0), lambda k, c, r, s: (c, r, s, k))
    k, _, r, s = _loops(sch, weights, at, (width, 1, 3, 3))
    _in_registers(sch, (r, s), k)


def _in_registers(sch: Any, unrolled: tuple[Any, ...], lane: Any, outside: tuple[Any, ...] = ()) -> None:
    """Order the loops ``outside``, ``unrolled`` (unrolled), then ``lane`` (vectorised) innermost; None
    stands for a loop of extent 1, which was not made."""
    sch.reorder(*[loop for loop in (*outside, *unrolled, lane) if loop is not None])
    for loop in unrolled:
        if loop is not None:
            sch.unroll(loop)
    if lane is not None:
        sch.vectorize(lane)


def _loops(sch: Any, block: Any, at: Any, extents: tuple[int, ...]) -> list[Any]:
    """``block``'s loops inside ``at``, one per axis of ``extents`` in order, None for an axis of extent 1
    (compute_at makes no loop for it; a loop of extent 1 that another primitive made is passed over)."""
    loops = iter(loop for loop in loops_below(sch, block, at) if int(sch.get(loop).extent) > 1)
    return [next(loops) if extent > 1 else None for extent in extents]


def _two_pass(sch: Any, second: Any, first_name: str, tile: Any, outputs: tuple[Any, Any], channel: Any,
              reduce: Any, lanes: int, parallel: bool = True) -> None:
    """A transform done as two 1-D passes, parallel over tiles (unless not ``parallel``: inside a block of tiles
    that is; ``tile`` None for a block of one), per block of ``lanes`` channels (vectorised): the second pass
    (``second``: its two ``outputs`` loops and its ``reduce`` loop unrolled) accumulates in a local buffer written
    back per block; the first (``first_name``) is computed per block into a local buffer, unrolled the same way."""
    block, inner = sch.split(channel, [None, lanes])
    sch.reorder(*[loop for loop in (tile, block, *outputs, reduce, inner) if loop is not None])
    if parallel:
        sch.parallel(tile)
    written = sch.cache_write(second, 0, "local")
    sch.reverse_compute_at(written, block)
    first = sch.get_sblock(first_name)
    sch.set_scope(first, 0, "local")
    sch.compute_at(first, block)
    x, y, *first_lanes, first_reduce = loops_below(sch, first, block)  # loops of extent 1 are not made
    sch.reorder(x, y, first_reduce, *first_lanes)
    for loop in (x, y, first_reduce, *outputs, reduce):
        sch.unroll(loop)
    if first_lanes:
        sch.vectorize(first_lanes[0])
    sch.vectorize(inner)
    _vectorize_init(sch, first, first_reduce, block)
    _vectorize_init(sch, second, outputs[0], block)
    _vectorize_innermost(sch, written, block)


def _vectorize_innermost(sch: Any, block: Any, at: Any, shared_with: Any = None) -> None:
    """Vectorise ``block``'s innermost loop inside ``at`` if it is its own (not also ``shared_with``'s)
    and longer than 1."""
    below = loops_below(sch, block, at)
    if shared_with is not None:
        theirs = [sch.get(loop) for loop in sch.get_loops(shared_with)]
        below = [loop for loop in below if not any(sch.get(loop).same_as(t) for t in theirs)]
    if below and int(sch.get(below[-1]).extent) > 1:
        sch.vectorize(below[-1])


def _vectorize_init(sch: Any, block: Any, loop: Any, at: Any) -> None:
    """Split the reduction's initialisation off at ``loop`` and vectorise its own innermost loop."""
    _vectorize_innermost(sch, sch.decompose_reduction(block, loop), at, shared_with=block)
