"""int8 convolutions on the CPU's dot-product instructions (docs/workloads-and-templates.md#int8): the packed NCHW[x]c
template (:mod:`opbench.space.packed`) with its weight packed so that one instruction (:mod:`opbench.space.dot_product`)
takes ``group`` input channels of ``lanes`` output channels::

    data   NCHW  -> (N, C/ic, H+2p, W+2p, ic)                      as the fp32 template's
    weight OIHW  -> (O/oc, I/ic, R, S, ic/group, oc, group)        (VNNI: group 4, oc a multiple of 16 lanes)
    conv   n | oc_outer | y_outer | x_outer | reduction | y_inner | x_inner | oc vectors | lanes, group (the instruction)

u8 activations x i8 weights summed in i32 exactly (AVX2 without VNNI: widened to i16 pairs); a model's quantized
convolution (:mod:`opbench.workloads.models.quantize`) scales the sums back to fp32 as the tile is written back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.exceptions import WorkloadError
from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Nest
from opbench.space._schedule import loops_below, vectorize_lanes
from opbench.space.dot_product import (
    COLUMN_UNIT,
    INSTRUCTIONS,
    STEP_UNIT,
    DotInstruction,
    instruction,
    multiples,
    operands_dtype,
    register,
)
from opbench.space.packed import CHANNEL_BLOCK_CAP, PackedConvTemplate
from opbench.workloads import Workload
from opbench.workloads.fused import Fused

if TYPE_CHECKING:
    from collections.abc import Callable

    from tvm.s_tir import Schedule


WRITE_BACKS = ("columns", "lanes")
# Output rows at least this wide take a residual in a direct write-back by the accumulator's lanes by default, narrower
# ones in a packed output's unpacking (docs/workloads-and-templates.md#int8)
LANES_FROM_COLUMNS = 28


@dataclass(frozen=True)
class DotProductConvTemplate(PackedConvTemplate):
    """A ``conv2d`` (or a model's fused one) of ``dtype`` operands on the CPU's dot-product instruction for it."""

    dtype: str = ""  # a dtype of INSTRUCTIONS
    predicated_columns: bool = False  # the instruction's block is matched whole: no predicated tile

    def refusal(self, workload: Workload) -> str | None:
        """Its dtype only (a model's convolution: its operands'), one group, output channels a multiple of
        :data:`COLUMN_UNIT` and input channels of :data:`STEP_UNIT`, on a CPU with an instruction for the dtype."""
        dtype = operands_dtype(workload)
        if dtype != self.dtype:
            return f"it schedules dtype={self.dtype} only, not {dtype}"
        reduce = [a.extent for a in workload.axes if a.reduce]
        if len(reduce) != 3:
            return "it schedules a convolution of one group (input channels and a 2-D window)"
        ext = self._extents(workload)
        if ext["k"] % COLUMN_UNIT or ext["c"] % STEP_UNIT:
            return (f"it needs output channels a multiple of {COLUMN_UNIT} and input channels of {STEP_UNIT}, "
                    f"not {ext['k']} and {ext['c']}")
        if self._dot() is None:
            return (f"the CPU has none of {', '.join(i.isa for i in INSTRUCTIONS[self.dtype])} "
                    f"(the operator's own template takes {self.dtype} too)")
        return None

    def _dot(self) -> DotInstruction | None:
        return instruction(self.dtype, current_shape().isa)

    def _instruction(self) -> DotInstruction:
        """The CPU's instruction for the dtype (a workload the template schedules has one: :meth:`refusal`)."""
        dot = self._dot()
        if dot is None:
            raise WorkloadError(f"template '{self.name}': the CPU has no dot-product instruction for {self.dtype}")
        return dot

    def _checked(self, workload: Workload) -> dict[str, int]:
        self.check_applies(workload)
        return self._extents(workload)

    def knobs(self, workload: Workload) -> list[Knob]:
        """The packed template's, its channel blocks whole instructions (output channels: vectors of
        :data:`COLUMN_UNIT`, input channels: groups of :data:`STEP_UNIT`), the weight packed at the root."""
        ext = self._checked(workload)
        blocks = {"oc_block": multiples(ext["k"], COLUMN_UNIT, CHANNEL_BLOCK_CAP),
                  "ic_block": multiples(ext["c"], STEP_UNIT, CHANNEL_BLOCK_CAP), "weight_pack_at": ("root",)}
        return [*(dataclasses.replace(k, choices=blocks[k.name]) if k.name in blocks else k for k in super().knobs(workload)),
                Knob("write_back", WRITE_BACKS, "with packed_output 0, the write-back's vectors: a row's columns, or the "
                                                "output channels (the accumulator's lanes; the output and a residual "
                                                "strided)")]

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        return {**super().parameter_vocabulary(), "write_back": WRITE_BACKS}

    def default_config(self, workload: Workload) -> Config:
        """The packed template's register tile, its output-channel block two of the instruction's vectors (one where
        two do not divide the channels) and its input-channel block 16 channels (4 groups of VNNI's 4) where they
        divide them; NCHW written directly by a row's columns, except where a model's convolution adds a residual:
        by the accumulator's lanes in rows of :data:`LANES_FROM_COLUMNS` or more, else through a packed output
        whose unpacking reads the residual (docs/workloads-and-templates.md#int8)."""
        ext, dot = self._checked(workload), self._instruction()
        config = super().default_config(workload)
        residual, wide = _adds_a_residual(workload), ext["ow"] >= LANES_FROM_COLUMNS
        config.update(oc_block=multiples(ext["k"], COLUMN_UNIT, 2 * dot.lanes)[-1],
                      ic_block=multiples(ext["c"], STEP_UNIT, 16)[-1], weight_pack_at="root",
                      packed_output=int(residual and not wide), write_back=WRITE_BACKS[residual and wide])
        return config

    def nest(self, config: Config, workload: Workload) -> Nest:
        """The packed template's, its vector the instruction's lanes."""
        return dataclasses.replace(super().nest(config, workload), vector=self._instruction().lanes)

    def _alternative(self, workload: Workload) -> str:
        return ""  # Winograd and the NCHW GEMM are fp32 schedules

    def _vectorize_write_back(self, sch: Schedule, accumulator: Any, config: Config, xo: Any) -> None:
        """By ``write_back``: with the accumulator's lanes (the output channels) innermost, each vector read whole from
        its registers and scaled by per-channel vectors, or as the packed template's."""
        if config["packed_output"] or config.get("write_back", "columns") == "columns":
            super()._vectorize_write_back(sch, accumulator, config, xo)
            return
        channels, *pixels = loops_below(sch, accumulator, xo)
        sch.reorder(*pixels, channels)
        vectorize_lanes(sch, channels)

    def _input_channel_split(self, ib: int) -> list[int | None]:
        group = self._instruction().group
        return [None, ib // group, group]

    def _split_lanes(self, sch: Schedule, block_loop: Any) -> list[Any]:
        return list(sch.split(block_loop, [None, self._instruction().lanes]))

    def _vectorize_lanes(self, sch: Schedule, lanes: list[Any]) -> None:
        pass  # the instruction is the vector (:meth:`_tensorize_lanes`)

    def _tensorize_lanes(self, sch: Schedule, lanes: list[Any]) -> None:
        """The instruction on the last vector's lanes and the group of input channels inside them; the vectors
        around them unrolled."""
        vectors, lane = lanes
        sch.tensorize(lane, register(self._instruction()))
        sch.unroll(vectors)

    def _weight_layout(self, ob: int, ib: int) -> Callable[..., tuple]:
        """(O/ob, I/ib, R, S, ib/group, ob, group): a register's worth of the instruction's operand contiguous."""
        group = self._instruction().group
        return lambda o, i, r, s: (o // ob, i // ib, r, s, i // group % (ib // group), o % ob, i % group)

    def _pack_weight(self, sch: Schedule, weight_pack: Any, ob: int, ib: int) -> None:
        """In the packed order, stores contiguous: output channels and the group innermost, fused."""
        from opbench.space._schedule import vectorize_lanes

        group = self._instruction().group
        o, i, r, s = sch.get_loops(weight_pack)
        oo, oi = sch.split(o, [None, ob])
        io, iq, ig = sch.split(i, [None, ib // group, group])
        sch.reorder(oo, io, r, s, iq, oi, ig)
        sch.parallel(sch.fuse(oo, io))
        vectorize_lanes(sch, sch.fuse(oi, ig))


def _adds_a_residual(workload: Workload) -> bool:
    """Whether a model's convolution reads a tensor of its output's shape besides its data and weight (its first two
    inputs): a residual added as the output is written."""
    if not isinstance(workload.op, Fused):
        return False
    return workload.op.output_shape(workload.params) in workload.op.input_shapes(workload.params)[2:]
