"""The tiled convolution template on a model's fused transposed convolution (TOPI's ``conv2d_transpose_nchw``:
the input spread by the stride (``data_dilate``) and padded (``data_pad``), the kernel flipped
(``kernel_transform``), then a stride-1 convolution, ``compute``). The spread is inlined into the padding, which
stays a stage placed by ``pad_at`` as the catalogue ``conv2d_transpose``'s; the flip is inlined into the
convolution's reads; the epilogue Relax fused after it (batch norm, ReLU, tanh) becomes one elementwise consumer.
The knobs are the catalogue operator's (``f_split``, ``y_split``, ``x_split``, ``rc_inner``, ...)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.space.tiled import TiledTemplate
from opbench.workloads import Workload
from opbench.workloads._base import Axis
from opbench.workloads.fused import anchor_block, blocks_after

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

SPREAD, PADDED, FLIPPED = "data_dilate", "data_pad", "kernel_transform"  # TOPI's producer blocks


@dataclass(frozen=True)
class FusedConvTransposeTemplate(TiledTemplate):
    name: str = "fused_conv2d_transpose"
    op: str = "fused_conv2d_transpose"  # the operator kind it schedules
    tiled: tuple[str, ...] = ("f", "y", "x")
    reduce_tiled: tuple[str, ...] = ("rc",)
    untiled_spatial: int = 1
    has_pad: bool = True

    def axes(self, workload: Workload) -> list[Axis]:
        """The anchor's loops (TOPI's b, c, h, w | dc, dh, dw) under the catalogue operator's names."""
        names = ("n", "f", "y", "x", "rc", "ry", "rx")
        return [Axis(name, a.extent, a.reduce) for name, a in zip(names, workload.axes)]

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any, Any]:
        sch.compute_inline(sch.get_sblock(SPREAD))
        sch.compute_inline(sch.get_sblock(FLIPPED))
        anchor = anchor_block(sch)
        after = blocks_after(sch, anchor)
        for name in after[:-1]:
            sch.compute_inline(sch.get_sblock(name))
        return anchor, sch.get_sblock(PADDED), sch.get_sblock(after[-1]) if after else None
