"""The tensor expressions of Winograd F(m x m, 3 x 3) (Lavin & Gray 2016), shared by a catalogue conv2d
(:mod:`opbench.space.winograd`) and a model's fused one (:mod:`opbench.space.winograd_fused`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import divisors


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


def stages(data: Any, weight: Any, shape: ConvShape, m: int, prepacked: bool) -> Any:
    """The Winograd stages from ``data`` to the inverse transform, and the output at ``(n, k, y, x)`` as a
    function of those indices. ``prepacked``: the weight's transform is one stage reading the weight alone,
    marked to be split off and run once (a model's constant weight); else a stage per 1-D pass."""
    from tvm import te, tirx
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    c_, k_, pad = shape.c, shape.k, shape.pad
    a, nh, nw, cb = m + 2, math.ceil(shape.oh / m), math.ceil(shape.ow / m), lanes(c_)
    tiles = shape.n * nh * nw
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
