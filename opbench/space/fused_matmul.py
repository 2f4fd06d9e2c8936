"""The tiled matmul template on a model's fused (batched) matmul: the anchor's leading spatial loops
are batch loops (S0), its last two ``i`` and ``j``, its reduction ``k``, so the knobs are the
catalogue matmul's (``i_split``, ``j_split``, ``k_inner``, ``order``, ``cache_write``...). Producer
blocks are inlined into the anchor's reads; the epilogue Relax fused after it (bias, residual add,
scaling) becomes one elementwise consumer, placed like the catalogue dense's bias.

A weight operand (2-D, indexed by ``j`` and ``k`` alone: a Linear layer's, often read transposed as
``W[j, k]``) is packed to ``(N / nb, K, nb)`` with ``nb`` the register tile's width, so the
vectorised ``j`` loop reads contiguous lanes (TVM's x86 ``dense_pack``). The packing copy is marked
as a layout rewrite: a model built with the schedule runs it once at build time, and a trial of the
operator once before timing it (``layout_transform=weights_prepacked``: what the model runs is timed)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, divisors, split_factors
from opbench.space._schedule import (
    IN_OP,
    LAYOUT_TRANSFORMS,
    TILE_VECTORS,
    WEIGHTS_PREPACKED,
    inline_around_anchor,
    mark_prepack,
    pack_copy,
    parallel_outer,
    vectorize_inner,
)
from opbench.space.tiled import TiledTemplate
from opbench.workloads import Workload
from opbench.workloads._base import Axis
from opbench.workloads.fused import anchor_block

if TYPE_CHECKING:
    from tvm.s_tir import Schedule


@dataclass(frozen=True)
class FusedMatmulTemplate(TiledTemplate):
    name: str = "fused_matmul"
    op: str = "fused_matmul"  # the operator kind it schedules
    tiled: tuple[str, ...] = ("i", "j")
    reduce_tiled: tuple[str, ...] = ("k",)

    def axes(self, workload: Workload) -> list[Axis]:
        """The anchor's loops as b0.., i, j | k; ``i`` and ``j`` at their padded extents where they are padded."""
        spatial = [a for a in workload.axes if not a.reduce]
        reduce = [a for a in workload.axes if a.reduce]
        names = [f"b{n}" for n in range(len(spatial) - 2)] + ["i", "j"]
        padded = [a + b for a, b in zip((spatial[-2].extent, spatial[-1].extent), _padding(workload))]
        extents = [a.extent for a in spatial[:-2]] + padded
        return [Axis(name, e) for name, e in zip(names, extents)] + [Axis("k", reduce[0].extent, True)]

    def untiled(self, workload: Workload) -> int:
        return len(workload.axes) - 3

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any, Any]:
        anchor, epilogue = inline_around_anchor(sch)
        if not any(_padding(workload)):
            return anchor, None, epilogue
        *_, rows, columns, _ = self.axes(workload)  # padded
        sch.pad_einsum(anchor, [1] * (len(workload.axes) - 3) + [rows.extent, columns.extent, 1])
        for producer in sch.get_producers(anchor):  # the padded operands' copies: stages of their own
            vectorize_inner(sch, producer)
            parallel_outer(sch, producer)
        unpad = sch.get_consumers(anchor)[0]  # the copy back to the unpadded output
        if epilogue is None:
            return anchor, None, unpad
        sch.compute_inline(unpad)  # the epilogue reads the padded output where it is valid
        return anchor, None, epilogue

    def knobs(self, workload: Workload) -> list[Knob]:
        return [*super().knobs(workload), Knob("layout_transform", (_layout_transform(workload.spec),),
                                                "where a weight operand is packed: once before the operator, as a "
                                                "model does at build time (in_op: no weight operand)")]

    def default_config(self, workload: Workload) -> Config:
        return {**super().default_config(workload), "layout_transform": _layout_transform(workload.spec)}

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        return {**super().parameter_vocabulary(), "layout_transform": LAYOUT_TRANSFORMS}

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        super().apply(sch, config, workload)
        anchor = anchor_block(sch)
        found = _weight_read(sch.get(anchor))
        if found is None:  # attention's batched matmuls: both operands are activations
            return
        index, transposed = found
        nb = split_factors(config["j_split"])[-1]
        pack = sch.cache_read(anchor, index, "global")
        if transposed:  # W[j, k]
            sch.transform_layout(anchor, ("read", index), lambda j, k: (j // nb, k, j % nb))
            pack_copy(sch, pack, {0: nb}, (0, 2, 1), parallel=1)
        else:  # B[k, j]
            sch.transform_layout(anchor, ("read", index), lambda k, j: (j // nb, k, j % nb))
            pack_copy(sch, pack, {1: nb}, (1, 0, 2), parallel=1)
        mark_prepack(sch, pack)


def _padding(workload: Workload) -> tuple[int, int]:
    """(rows, columns) a model's matmul is padded by: :func:`_column_padding`, then :func:`row_padding` of its
    padded columns."""
    *_, rows, columns = (a.extent for a in workload.axes if not a.reduce)
    column_padding = _column_padding(workload.spec)
    return row_padding(rows, columns + column_padding), column_padding


def row_padding(rows: int, columns: int) -> int:
    """Rows a matmul of ``columns`` is padded by to a whole register tile of rows (:func:`row_tile`) where no tile
    of more than half of it divides them (ViT-Base's 197 tokens: 3, to 200) and its columns fill a register tile
    (the padded copy of the left operand then costs a fraction of the product); 0 else. A last tile predicated on
    its rows keeps the whole tile's accumulators in memory instead of registers: 197 rows ran at half the speed of
    128 with the same tiles. A GCN's 2708 x 2708 adjacency times 7 columns is mostly that copy: padded, it ran 1.8x
    slower."""
    tile = row_tile()
    wide = columns >= TILE_VECTORS * current_shape().fp32_lanes
    return -rows % tile if wide and rows > tile and 2 * divisors(rows, tile)[-1] <= tile else 0


def row_tile() -> int:
    """The register tile's rows of a matmul on this CPU (:func:`default_tiles`), a power of two."""
    rows = current_shape().accumulator_registers // TILE_VECTORS
    return 1 << (rows.bit_length() - 1)


def _column_padding(spec: str) -> int:
    """Columns a plain matmul of two activations (its anchor alone: attention's scores, Q x Kᵀ; a GCN's adjacency
    times its 7 classes) is padded by where no vector divides them: to a whole register tile (:data:`TILE_VECTORS`
    vectors) where they are more than a vector (ViT-Base's 197 tokens: 27, to 224), to one vector where they are
    more than a quarter of one (7 to 16 on AVX-512); 0 else. Its output is copied back (predicated vectors would
    scalarise: docs/workloads-and-templates.md has the GCN's times)."""
    lanes, columns = current_shape().fp32_lanes, _plain_columns(spec)
    if not columns % lanes or columns <= lanes // 4:
        return 0
    return -columns % (TILE_VECTORS * lanes if columns > lanes else lanes)


@functools.cache
def _plain_columns(spec: str) -> int:
    """The columns of a matmul PrimFunc of two activations whose anchor is its only block; 0 for one with other blocks
    or a weight operand (packed at build time, which a padded copy would hide from the model's layout rewrite)."""
    import tvm
    from tvm import s_tir

    from opbench.workloads import parse_workload

    sch = s_tir.Schedule(tvm.IRModule({"main": parse_workload(spec).prim_func()}))
    anchor = sch.get(anchor_block(sch))
    plain = len(sch.get_child_blocks(sch.get_sblock("root"))) == 1 and _weight_read(anchor) is None
    return int(anchor.iter_vars[-2].dom.extent) if plain else 0


@functools.cache
def _layout_transform(spec: str) -> str:
    """:data:`WEIGHTS_PREPACKED` where the matmul has a weight operand, else :data:`IN_OP` (nothing to pack)."""
    from opbench.workloads import parse_workload

    return WEIGHTS_PREPACKED if weight_read_of(parse_workload(spec).prim_func()) is not None else IN_OP


def weight_read_of(func: Any) -> tuple[int, bool] | None:
    """:func:`_weight_read` of the anchor of a matmul PrimFunc."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return _weight_read(sch.get(anchor_block(sch)))


def _weight_read(block: Any) -> tuple[int, bool] | None:
    """The read of ``block`` (a matmul: loops ..., i, j | k) that is a 2-D weight indexed by ``j`` and
    ``k`` alone, and whether it is read transposed (``W[j, k]``); None when there is none."""
    j, k = (iv.var for iv in block.iter_vars[-2:])
    for index, region in enumerate(block.reads):
        starts = [r.min for r in region.region]
        if len(starts) == 2 and any(starts[0].same_as(a) and starts[1].same_as(b) for a, b in ((j, k), (k, j))):
            return index, starts[0].same_as(j)
    return None
