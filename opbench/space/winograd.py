"""Winograd F(m x m, 3 x 3) for a catalogue conv2d (3x3, stride 1, float32), after Lavin & Gray (2016).

The output is cut into ``m x m`` tiles; each tile's ``(m+2) x (m+2)`` input patch is transformed
(``B^T d B``), multiplied channel by channel with the transformed weight (``G g G^T``) as
``(m+2)^2`` independent GEMMs (tiles x input channels x output channels), and transformed back
(``A^T M A``). For F(4x4, 3x3) that is 4x fewer multiplications than the direct convolution; the
transforms cost memory traffic instead, and the weight's transform runs in the operator, timed,
so it pays where there are many tiles per weight (resnet50-c2, 196 tiles: the direct default's
1.14-1.23 ms against 0.78-1.01 ms, three interleaved runs; resnet50-c5, 4 tiles: 16.8 ms in a
prototype with a 1 x 32 register tile, against 1.4 ms direct). Error grows with the tile and the input
channels (F(4x4) on 512 channels: 6.5e-4 max abs, inside the float32 check of 1e-3).

Layouts (``P`` tiles, ``a = m + 2``), each transform's channel loop innermost and vectorised::

    data_pack         (N, C/cb, a-covering H, W, cb)   padding and packing in one copy
    kernel_transform  (a, a, C, K)
    input_transform   (a, a, P, C)      rows, then columns (two 1-D passes in registers)
    batch_gemm        (a, a, P, K)      per (a, a): a register tile of rows x cols, reduction chunks
    inverse_transform (P, m, m, K)      columns, then rows; then copied to NCHW
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opbench.space._base import Config, Knob, divisors
from opbench.space._schedule import VECTOR_LANES, loops_below
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm import IRModule

TILES = (2, 4)  # m: F(2x2, 3x3) is the more accurate, F(4x4, 3x3) the fewer multiplications
KNOBS = ("winograd_tile", "winograd_rows", "winograd_cols", "winograd_reduce")
ROWS_CAP, COLS_CAP, REDUCE_CAP = 16, 64, 64
# The default picks Winograd where a 4x4 tiling has at least this many tiles per image and weight.
MIN_TILES = 64


def applies(workload: Workload) -> bool:
    """A float32 conv2d with a 3x3 window, stride 1 and no dilation."""
    p = workload.params
    return (workload.op.name == "conv2d" and workload.dtype == "float32" and p["r"] == p["s"] == 3
            and p["stride"] == p["dilation"] == 1)


def _tiles(workload: Workload, m: int) -> int:
    _, _, oh, ow = workload.op.output_shape(workload.params)
    return workload.params["n"] * math.ceil(oh / m) * math.ceil(ow / m)


def _rows(workload: Workload, cap: int) -> tuple[int, ...]:
    """Register-tile rows that divide the tile count of every m."""
    return tuple(sorted(set.intersection(*(set(divisors(_tiles(workload, m), cap)) for m in TILES))))


def knobs(workload: Workload) -> list[Knob]:
    p = workload.params
    tile, rows, cols, reduce = KNOBS
    return [
        Knob(tile, TILES, "Winograd output tile m (F(m x m, 3 x 3))"),
        Knob(rows, _rows(workload, ROWS_CAP), "GEMM register tile: tiles per step"),
        Knob(cols, divisors(p["k"], COLS_CAP), f"GEMM register tile: output channels per step ({p['k']})"),
        Knob(reduce, divisors(p["c"], REDUCE_CAP), f"GEMM reduction chunk of input channels ({p['c']})"),
    ]


def default_config(workload: Workload) -> Config:
    """F(4x4, 3x3); a register tile of up to 4 tiles by 64 output channels (16 vectors), the reduction
    in chunks of up to 64 (on resnet50-c2, 4 x 64 and 7 x 32 measured the same; 1 x 32 was 13%
    slower, F(2x2) 23%)."""
    p = workload.params
    return {"winograd_tile": 4, "winograd_rows": _rows(workload, 4)[-1], "winograd_cols": divisors(p["k"], COLS_CAP)[-1],
            "winograd_reduce": divisors(p["c"], REDUCE_CAP)[-1]}


def preferred(workload: Workload) -> bool:
    """Whether the default takes Winograd: enough tiles to pay for the weight's transform."""
    return _tiles(workload, 4) >= MIN_TILES


def _lanes(extent: int) -> int:
    return divisors(extent, VECTOR_LANES)[-1]


def compute(workload: Workload, m: int) -> Any:
    """The Winograd PrimFunc of ``workload`` (same signature as its direct one: data, weight -> out)."""
    import tvm
    from tvm import te, tirx
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    p = workload.params
    n_, c_, h_, w_, k_, pad = p["n"], p["c"], p["h"], p["w"], p["k"], p["pad"]
    _, _, oh, ow = workload.op.output_shape(p)
    a, nh, nw, cb = m + 2, math.ceil(oh / m), math.ceil(ow / m), _lanes(c_)
    tiles = n_ * nh * nw
    data = te.placeholder((n_, c_, h_, w_), "float32", name="data")
    weight = te.placeholder((k_, c_, 3, 3), "float32", name="weight")
    A, B, G = winograd_transform_matrices(m, 3, "float32")
    zero = tirx.const(0.0, "float32")
    packed = te.compute((n_, c_ // cb, nh * m + 2, nw * m + 2, cb), lambda n, co, y, x, ci: tirx.if_then_else(
        tirx.all(y >= pad, y < h_ + pad, x >= pad, x < w_ + pad), data[n, co * cb + ci, y - pad, x - pad], zero),
        name="data_pack")
    r, s = te.reduce_axis((0, 3), "r"), te.reduce_axis((0, 3), "s")
    u = te.compute((a, a, c_, k_), lambda e, v, c, k: te.sum(weight[k, c, r, s] * G[e, r] * G[v, s], axis=[r, s]),
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
    out = te.compute((n_, k_, oh, ow), lambda n, k, y, x: inverse[(n * nh + y // m) * nw + x // m, y % m, x % m, k],
                     name="output")
    return tvm.IRModule({"main": te.create_prim_func([data, weight, out])})


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


def module(workload: Workload, config: Config) -> IRModule:
    """``workload`` as Winograd F(m x m, 3 x 3), scheduled by ``config``'s ``winograd_*`` knobs."""
    from tvm import s_tir

    p = workload.params
    sch = s_tir.Schedule(compute(workload, config["winograd_tile"]))
    for name in ("A", "B", "G"):  # the transform matrices: constants folded into the unrolled passes
        sch.compute_inline(sch.get_sblock(name))
    cb, kb = _lanes(p["c"]), _lanes(p["k"])

    pack = sch.get_sblock("data_pack")
    n, co, y, _, ci = sch.get_loops(pack)
    sch.parallel(sch.fuse(n, co, y))
    sch.vectorize(ci)

    kernel = sch.get_sblock("kernel_transform")
    e, v, c, k, r, s = sch.get_loops(kernel)
    ko, ki = sch.split(k, [None, kb])
    sch.reorder(c, ko, e, v, r, s, ki)
    sch.parallel(c)
    for loop in (e, v, r, s):
        sch.unroll(loop)
    sch.vectorize(ki)
    _vectorize_init(sch, kernel, e, ko)

    # input: per (tile, channel block), rows then columns of the patch, all in registers
    second = sch.get_sblock("input_transform")
    e, f, t, c, r2 = sch.get_loops(second)
    _two_pass(sch, second, "input_rows", t, (e, f), c, r2, cb)

    gemm = sch.get_sblock("batch_gemm")
    e, f, t, k, rc = sch.get_loops(gemm)
    batch = sch.fuse(e, f)
    to, ti = sch.split(t, [None, config["winograd_rows"]])
    ko, ki = sch.split(k, [None, config["winograd_cols"]])
    rco, rci = sch.split(rc, [None, config["winograd_reduce"]])
    sch.reorder(batch, to, ko, rco, rci, ti, ki)
    accumulator = sch.cache_write(gemm, 0, "local")
    sch.reverse_compute_at(accumulator, ko)
    sch.parallel(batch)
    sch.unroll(ti)
    kio, kii = sch.split(ki, [None, _lanes(config["winograd_cols"])])
    sch.unroll(kio)
    sch.vectorize(kii)
    _vectorize_init(sch, gemm, rco, ko)
    _vectorize_innermost(sch, accumulator, ko)

    # inverse: per (tile, output-channel block), columns then rows, in registers
    second = sch.get_sblock("inverse_transform")
    t, i, j, k, a1 = sch.get_loops(second)
    _two_pass(sch, second, "inverse_cols", t, (i, j), k, a1, kb)

    n, k, _, _ = sch.get_loops(sch.get_sblock("output"))
    sch.parallel(sch.fuse(n, k))
    return sch.mod


def _two_pass(sch: Any, second: Any, first_name: str, tile: Any, outputs: tuple[Any, Any], channel: Any,
              reduce: Any, lanes: int) -> None:
    """A transform done as two 1-D passes, parallel over tiles, per block of ``lanes`` channels
    (vectorised): the second pass (``second``: its two ``outputs`` loops and its ``reduce`` loop
    unrolled) accumulates in a local buffer written back per block; the first (``first_name``) is
    computed per block into a local buffer, unrolled the same way."""
    block, inner = sch.split(channel, [None, lanes])
    sch.reorder(tile, block, *outputs, reduce, inner)
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
