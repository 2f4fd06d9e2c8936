"""The tiled matmul template on a model's fused (batched) matmul: the anchor's leading spatial loops
are batch loops (S0), its last two ``i`` and ``j``, its reduction ``k``, so the knobs are the
catalogue matmul's (``i_split``, ``j_split``, ``k_inner``, ``order``, ``cache_write``...). Producer
blocks are inlined into the anchor's reads; the epilogue Relax fused after it (bias, residual add,
scaling) becomes one elementwise consumer, placed like the catalogue dense's bias."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.space.tiled import TiledTemplate
from opbench.workloads import Workload
from opbench.workloads._base import Axis
from opbench.workloads.fused import anchor_block, blocks_after

if TYPE_CHECKING:
    from tvm.s_tir import Schedule


@dataclass(frozen=True)
class FusedMatmulTemplate(TiledTemplate):
    name: str = "fused_matmul"
    op: str = "fused_matmul"  # the operator kind it schedules
    tiled: tuple[str, ...] = ("i", "j")
    reduce_tiled: tuple[str, ...] = ("k",)

    def axes(self, workload: Workload) -> list[Axis]:
        spatial = [a for a in workload.axes if not a.reduce]
        reduce = [a for a in workload.axes if a.reduce]
        names = [f"b{n}" for n in range(len(spatial) - 2)] + ["i", "j"]
        return [Axis(name, a.extent) for name, a in zip(names, spatial)] + [Axis("k", reduce[0].extent, True)]

    def untiled(self, workload: Workload) -> int:
        return len(workload.axes) - 3

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any, Any]:
        anchor = anchor_block(sch)
        after = blocks_after(sch, anchor)
        for producer in sch.get_producers(anchor):  # reshapes and transposes of its inputs
            sch.compute_inline(producer)
        for name in after[:-1]:  # into the last, which then reads the anchor's output alone
            sch.compute_inline(sch.get_sblock(name))
        return anchor, None, sch.get_sblock(after[-1]) if after else None
