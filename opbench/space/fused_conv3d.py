"""The tiled 3-D convolution template on a model's fused ``conv3d`` (TOPI's ``conv3d_ncdhw``, its padding the stage
``pad_temp``, which ``pad_at`` places as the catalogue ``conv3d``'s; the batch norm, residual add and ReLU Relax
fused after it one elementwise consumer). The knobs are the catalogue operator's (``f_split``, ``y_split``,
``x_split``, ``rc_inner``, ...); batch and depth stay whole."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.space.tiled import TiledTemplate
from opbench.workloads import Workload
from opbench.workloads._base import Axis
from opbench.workloads.fused import PAD_PRODUCER, anchor_block, blocks_after

if TYPE_CHECKING:
    from tvm.s_tir import Schedule


@dataclass(frozen=True)
class FusedConv3dTemplate(TiledTemplate):
    name: str = "fused_conv3d"
    op: str = "fused_conv3d"  # the operator kind it schedules
    tiled: tuple[str, ...] = ("f", "y", "x")
    reduce_tiled: tuple[str, ...] = ("rc",)
    untiled_spatial: int = 2
    has_pad: bool = True

    def axes(self, workload: Workload) -> list[Axis]:
        """The anchor's loops (TOPI's nn, ff, three spatial | rc, three kernel) under the catalogue operator's names."""
        names = ("n", "f", "z", "y", "x", "rc", "rz", "ry", "rx")
        return [Axis(name, a.extent, a.reduce) for name, a in zip(names, workload.axes)]

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any, Any]:
        anchor = anchor_block(sch)
        after = blocks_after(sch, anchor)
        for name in after[:-1]:
            sch.compute_inline(sch.get_sblock(name))
        pad = sch.get_sblock(PAD_PRODUCER) if workload.op.has_pad_stage(workload.params) else None
        return anchor, pad, sch.get_sblock(after[-1]) if after else None
