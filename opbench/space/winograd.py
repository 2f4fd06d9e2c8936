"""Winograd F(m x m, 3 x 3) for a catalogue conv2d (3x3, stride 1, float32), after Lavin & Gray (2016).

The output is cut into ``m x m`` tiles; each tile's ``(m+2) x (m+2)`` input patch is transformed
(``B^T d B``), multiplied channel by channel with the transformed weight (``G g G^T``) as
``(m+2)^2`` independent GEMMs (tiles x input channels x output channels), and transformed back
(``A^T M A``). For F(4x4, 3x3) that is 4x fewer multiplications than the direct convolution; the
transforms cost memory traffic instead. The weight's transform runs in the operator (unless the trial's
``layout_transform`` is ``weights_prepacked``: then once before, as a model's), timed, one
output-channel block at a time just before that block's GEMMs, so its slice stays in cache. A model's convolution
may instead have its weight transformed once, at build time (``winograd_in_op`` 0): then each call reads the whole
transformed weight, (m+2)^2/9 times the weight, from wherever it stays between calls. Error grows with the tile and
the input channels, inside the float32 check of 1e-3 (docs/workloads-and-templates.md#winograd has the
measurements behind these choices).

Layouts (``P`` tiles, ``a = m + 2``), each transform's channel loop innermost and vectorised::

    data_pack         (N, C/cb, a-covering H, W, cb)   padding and packing in one copy
    input_transform   (a, a, P, C)      rows, then columns (two 1-D passes in registers)
    kernel_transform  (C, a, a, K)      per output-channel block (parallel), per input channel: the
                                        3x3 weights gathered into registers, rows then columns
    batch_gemm        (a, a, P, K)      per block and (a, a): a register tile of rows x cols, reduction chunks
    inverse_transform (P, m, m, K)      columns, then rows; then copied to NCHW

With the weight transformed once and ``winograd_block`` > 0, the input transform, the GEMMs and the inverse run per
block of that many register-tile steps of tiles instead (parallel over the blocks), so the transformed input and the
GEMMs' output of a block stay in cache.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space import winograd_fused
from opbench.space._base import Config, Knob, Nest, divisors
from opbench.space._schedule import WEIGHTS_PREPACKED
from opbench.space.winograd_stages import TILES, ConvShape, schedule, stages
from opbench.space.winograd_stages import lanes as _lanes
from opbench.space.winograd_stages import tile_count as tiles
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm import IRModule

KNOBS = ("winograd_tile", "winograd_rows", "winograd_cols", "winograd_reduce", "winograd_block", "winograd_in_op")
BLOCKS = (0, 1, 2, 4)  # tiles fused per block, in register-tile steps (0: each stage over all tiles)
ROWS_CAP, COLS_CAP, REDUCE_CAP = 16, 64, 64
DEFAULT_ROWS_CAP = 8
# ... unless no divisor of the tile count from this to it exists: then the largest up to ROWS_CAP
MIN_DEFAULT_ROWS = 4
# The default tile m minimises (m+2)^2 * (WEIGHT_TILES + tiles(m)): the (m+2)^2 GEMMs each cost one
# weight transform (as much as this many tiles' multiplications) plus their tiles. Measured with the
# GEMM tile of the default, in one process: F(2x2) won on 7x7 and 14x14 outputs (512 and 256
# channels), F(4x4) on 28x28 and 56x56 (128 and 64 channels); any value from 11 to 68 orders them so.
WEIGHT_TILES = 27
# A model's transformed weight larger than the L2 is still transformed once, its stages fused per block of tiles, where
# the conv has this many tiles of F(m) or more and the weight fits this many L2s (read whole by each block, from the L3)
MIN_TILES_WEIGHT_ONCE, MAX_WEIGHT_ONCE_L2S = 128, 4
MIN_FUSED_TILES = 16  # a model's conv with fewer output tiles stays direct by default (preferred())
# ... and one whose GEMMs do fewer multiply-adds per value its transforms move, C * K / (C + K), than this on a CPU
# whose FMA units run 512 bits (set on a Xeon), in proportion on a narrower one (deep_enough)
MIN_GEMM_DEPTH = 48
# ... or than this where the stages run fused per block of tiles in the L2 (fused_block): their values then move
# through the cache, not memory (set on the Zen 4: docs/workloads-and-templates.md#fused-winograd)
MIN_BLOCKED_GEMM_DEPTH = 16


def _of_a_model(workload: Workload) -> bool:
    """A model's fused operator (:mod:`opbench.space.winograd_fused`), not a catalogue conv2d."""
    return workload.op.name != "conv2d"


def applies(workload: Workload) -> bool:
    """A float32 conv2d with a 3x3 window, stride 1 and no dilation; or a model's fused operator around one
    (:mod:`opbench.space.winograd_fused`)."""
    if _of_a_model(workload):
        return winograd_fused.applies(workload)
    p = workload.params
    return workload.dtype == "float32" and p["r"] == p["s"] == 3 and p["stride"] == p["dilation"] == 1


def conv_shape(workload: Workload) -> ConvShape:
    """The convolution's sizes, of a catalogue conv2d or a model's fused one."""
    if _of_a_model(workload):
        return winograd_fused.conv_shape(workload)
    p = workload.params
    _, _, oh, ow = workload.op.output_shape(p)
    return ConvShape(p["n"], p["c"], p["h"], p["w"], p["k"], p["pad"], oh, ow)


def _rows(shape: ConvShape) -> tuple[int, ...]:
    """Register-tile rows that divide the tile count of some m (another m's last step is partial)."""
    return tuple(sorted(set().union(*(divisors(tiles(shape, m), ROWS_CAP) for m in TILES))))


def knobs(workload: Workload) -> list[Knob]:
    s = conv_shape(workload)
    tile, rows, cols, reduce, block, in_op = KNOBS
    own = [
        Knob(tile, TILES, "Winograd output tile m (F(m x m, 3 x 3))"),
        Knob(rows, _rows(s), "GEMM register tile: tiles per step"),
        Knob(cols, divisors(s.k, COLS_CAP), f"GEMM register tile: output channels per step ({s.k})"),
        Knob(reduce, divisors(s.c, REDUCE_CAP), f"GEMM reduction chunk of input channels ({s.c})"),
        Knob(block, BLOCKS, "0: each stage over all tiles; else per block of this many register-tile steps (parallel): "
                            "its input transform, GEMMs and inverse in cache"),
    ]
    if _of_a_model(workload):
        own.append(Knob(in_op, (0, 1), "the weight transformed in the operator, per output-channel block (1), "
                                       "or once at build time (0)"))
    return own


def _cheapest_tile(shape: ConvShape, weight_tiles: int) -> int:
    """The m that minimises ``(m+2)^2 * (weight_tiles + tiles(m))``: the GEMMs' work, with each weight transform
    costing ``weight_tiles`` tiles' multiplications (0 where the weight is transformed once, outside the operator)."""
    return min(TILES, key=lambda m: (m + 2) ** 2 * (weight_tiles + tiles(shape, m)))


def arithmetic_flops(config: Config, workload: Workload) -> float:
    """FLOPs of the stages ``config`` runs, each transform counted as the dense matrix products it is: the input's
    (``B^T d B``, per tile and input channel), the GEMMs, the inverse (``A^T M A``, per tile and output channel) and,
    where it runs in the operator, the weight's (``G g G^T``, per channel pair). For F(4x4, 3x3) on resnet50-c2 that
    is about a third of the direct convolution's FLOPs, which a record's ``gflops`` still counts (its effective
    rate)."""
    s, m = conv_shape(workload), config["winograd_tile"]
    a, p = m + 2, tiles(s, m)
    gemm = 2 * a * a * p * s.c * s.k
    input_transform = 4 * a ** 3 * p * s.c
    inverse = 2 * (m * a * a + m * m * a) * p * s.k
    weight = 2 * (9 * a + 3 * a * a) * s.c * s.k if _weight_in_op(config, workload) else 0
    return float(gemm + input_transform + inverse + weight)


def transformed_weight_bytes(shape: ConvShape, m: int) -> int:
    """The float32 weight transformed for F(m x m, 3 x 3): ``(m+2)^2`` matrices of input x output channels."""
    return (m + 2) ** 2 * shape.c * shape.k * 4


def default_config(workload: Workload) -> Config:
    """The weight transformed in the operator, unless a model's transformed weight fits the CPU's L2 (where a
    model's call finds it cached) or its conv has tiles enough to read it per block (:func:`_read_by_blocks`); the m
    of the cost model (:data:`WEIGHT_TILES`, none where the weight is transformed once); a register tile of up to 8
    tiles (dividing their count; :func:`_default_rows`) by one vector of output channels, the reduction in chunks of
    up to 64 input channels. A weight transformed once goes with the stages fused per block of tiles where a block
    fits the L2 (:func:`fused_block`), and one larger than the L2 with blocks of one register-tile step
    (docs/workloads-and-templates.md#fused-winograd)."""
    s = conv_shape(workload)
    model = _of_a_model(workload)
    l2, once = current_shape().l2_kb * 1024, _cheapest_tile(s, 0)
    weight = transformed_weight_bytes(s, once)
    in_op = not model or (weight > l2 and not _read_by_blocks(tiles(s, once), weight, l2))
    m = _cheapest_tile(s, WEIGHT_TILES if in_op else 0)
    rows = _default_rows(tiles(s, m))
    block = 0 if in_op else fused_block(s, m, rows) if weight <= l2 else 1
    config = {"winograd_tile": m, "winograd_rows": rows, "winograd_cols": _lanes(s.k),
              "winograd_reduce": divisors(s.c, REDUCE_CAP)[-1], "winograd_block": block}
    return {**config, "winograd_in_op": int(in_op)} if model else config


def _read_by_blocks(tile_count: int, weight_bytes: float, l2_bytes: float) -> bool:
    """Whether a model's transformed weight of ``weight_bytes``, larger than the L2, is still best transformed
    once, every stage run per block of its ``tile_count`` tiles (:data:`MIN_TILES_WEIGHT_ONCE`,
    :data:`MAX_WEIGHT_ONCE_L2S`): stage by stage, the input transform's tiles and the GEMMs' output-channel blocks
    fall to different threads, so each stage reads half its input from the other core's cache, slow where the
    cores share no cache; per block each thread keeps its own tiles (docs/workloads-and-templates.md#fused-winograd)."""
    return tile_count >= MIN_TILES_WEIGHT_ONCE and weight_bytes <= MAX_WEIGHT_ONCE_L2S * l2_bytes


def _default_rows(count: int) -> int:
    """The register tile's rows for ``count`` tiles: the largest divisor up to :data:`DEFAULT_ROWS_CAP`, or where
    that is under :data:`MIN_DEFAULT_ROWS`, up to :data:`ROWS_CAP`."""
    rows = divisors(count, DEFAULT_ROWS_CAP)[-1]
    return rows if rows >= MIN_DEFAULT_ROWS else divisors(count, ROWS_CAP)[-1]


def fused_block(shape: ConvShape, m: int, rows: int) -> int:
    """The larger of 1 and 2 register-tile steps of ``rows`` tiles whose block fits the CPU's L2 with the whole
    transformed weight (each block reads all of it), its transformed input and its GEMMs' output; 0 where
    neither does (where the transformed weight alone fills the L2, fusing loses: ``benchmarks/algorithm_rule.py``)."""
    a = m + 2
    working_set = lambda steps: transformed_weight_bytes(shape, m) + a * a * steps * rows * (shape.c + shape.k) * 4
    return max((steps for steps in (1, 2) if working_set(steps) <= current_shape().l2_kb * 1024), default=0)


def nest(config: Config, workload: Workload) -> Nest:
    """The batched GEMM's nest: a register tile of tiles x output channels (vectors of up to the CPU's lanes),
    the reduction in chunks of input channels, parallel over the output-channel blocks, or over the blocks of tiles
    where the stages run fused (``winograd_block``, the weight transformed once)."""
    s, cols, rows = conv_shape(workload), config["winograd_cols"], config["winograd_rows"]
    block = 0 if _weight_in_op(config, workload) else config.get("winograd_block", 0)
    parallel = math.ceil(tiles(s, config["winograd_tile"]) / (block * rows)) if block else s.k // cols
    return Nest((rows, cols), _lanes(cols) if cols > 1 else 0, config["winograd_reduce"], parallel)


def preferred(workload: Workload) -> bool:
    """Whether the default takes Winograd: where both channel counts fill the CPU's vectors. A model's also needs
    :data:`MIN_FUSED_TILES` tiles of the m that suits its weight transformed once (each transformed weight is read once
    per tile), and channels enough for its GEMMs to outweigh its transforms (:func:`deep_enough`; fewer where its
    default runs the stages fused in the L2, :data:`MIN_BLOCKED_GEMM_DEPTH`). docs/workloads-and-templates.md#winograd
    and #fused-winograd have the measurements."""
    s = conv_shape(workload)
    lanes = current_shape().fp32_lanes
    if _of_a_model(workload):
        config = default_config(workload)
        depth = MIN_BLOCKED_GEMM_DEPTH if config["winograd_block"] else MIN_GEMM_DEPTH
        if tiles(s, _cheapest_tile(s, 0)) < MIN_FUSED_TILES or not deep_enough(s, depth):
            return False
    return s.c % lanes == 0 and s.k % lanes == 0


def deep_enough(shape: ConvShape, min_depth: int = MIN_GEMM_DEPTH) -> bool:
    """Whether the GEMMs do at least ``min_depth`` multiply-adds per value the transforms move (per tile
    and point of it: ``C * K`` multiply-adds, ``C + K`` values transformed), scaled by how wide the CPU's FMA units
    run (:attr:`~opbench.hardware.cpu_shape.CpuShape.fma_bits`, over 512): where a multiply-add takes longer
    against the transforms' memory traffic, saving them pays at a smaller depth (measured at 512 and 256 bits:
    docs/workloads-and-templates.md#fused-winograd)."""
    depth = min_depth * min(current_shape().fma_bits, 512) / 512
    return shape.c * shape.k >= depth * (shape.c + shape.k)


def compute(workload: Workload, m: int, prepacked: bool = False) -> Any:
    """The Winograd PrimFunc of ``workload`` (same signature as its direct one: data, weight -> out), the
    weight transformed inside it (``prepacked``: in one stage marked to be split off)."""
    import tvm
    from tvm import te

    shape = conv_shape(workload)
    data = te.placeholder((shape.n, shape.c, shape.h, shape.w), "float32", name="data")
    weight = te.placeholder((shape.k, shape.c, 3, 3), "float32", name="weight")
    conv = stages(data, weight, shape, m, prepacked)
    out = te.compute((shape.n, shape.k, shape.oh, shape.ow), lambda *i: conv(i), name="output")
    return tvm.IRModule({"main": te.create_prim_func([data, weight, out])})


def module(workload: Workload, config: Config) -> IRModule:
    """``workload`` as Winograd F(m x m, 3 x 3), scheduled by ``config``'s ``winograd_*`` knobs."""
    if _of_a_model(workload):
        return winograd_fused.scheduled(workload.prim_func(), config)
    prepacked = not _weight_in_op(config, workload)
    return schedule(compute(workload, config["winograd_tile"], prepacked), config, conv_shape(workload), prepacked)


def _weight_in_op(config: Config, workload: Workload) -> bool:
    """Whether the weight's transform runs in the operator: a model's per ``winograd_in_op``, a catalogue conv's
    unless its ``layout_transform`` is ``weights_prepacked``."""
    if _of_a_model(workload):
        return bool(config.get("winograd_in_op", 1))
    return config.get("layout_transform") != WEIGHTS_PREPACKED
