"""Templates for multi-stage memory-bound operators: row reductions (softmax, layer_norm) and
elementwise chains (add+relu).

The output stage's outer loops form a *row* loop (all but the last axis; for ``elementwise`` all
axes fused then split by ``inner_split``). Producers are inlined where elementwise (``inline``),
then computed per row or in their own loop nests (``compute_at``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Template, divisors
from opbench.space._schedule import is_reduction, parallel_outer, vectorize_inner
from opbench.space.tiled import UNROLL_STEPS
from opbench.workloads import Workload
from opbench.workloads.fused import child_blocks

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

INNER_SPLIT_CAP = 64
COMPUTE_AT = ("root", "row")


@dataclass(frozen=True)
class RowwiseTemplate(Template):
    name: str
    fuse_all: bool = False  # elementwise: fuse every axis into one loop before splitting

    def knobs(self, workload: Workload) -> list[Knob]:
        return [
            Knob("inline", (0, 1), "inline elementwise producer stages into their consumers"),
            Knob("compute_at", COMPUTE_AT, "remaining producers: own loop nests, or per row of the output"),
            Knob("parallel", (0, 1), "parallelise the row loop (and root stages' outer loops)"),
            Knob("inner_split", divisors(self._inner_extent(workload), INNER_SPLIT_CAP),
                 "factor of the innermost split, dividing the loop (the vector length when vectorised)"),
            Knob("vectorize", (0, 1), "vectorise the innermost split loop"),
            Knob("reduce_vector", self._partials(workload, INNER_SPLIT_CAP),
                 "partial sums a row reduction keeps (rfactor), accumulated as one vector; 1: one scalar"),
            Knob("unroll_max_step", UNROLL_STEPS, "pragma_auto_unroll_max_step on the row loop"),
            Knob("unroll_explicit", (0, 1), "pragma_unroll_explicit: unroll in TIR rather than by LLVM"),
        ]

    def _inner_extent(self, workload: Workload) -> int:
        """The output's last axis (``fuse_all``: all its axes fused)."""
        extents = workload.op.output_shape(workload.params)
        return math.prod(extents) if self.fuse_all else extents[-1]

    def _partials(self, workload: Workload, cap: int) -> tuple[int, ...]:
        """How many partial results a row reduction may keep, at most ``cap``: divisors of the row's length
        that take at least two steps (``fuse_all``: no reduction, 1)."""
        row = 1 if self.fuse_all else workload.op.output_shape(workload.params)[-1]
        return divisors(row, max(1, min(cap, row // 2)))

    def output_block(self, sch: Schedule, workload: Workload) -> Any:
        """The block that writes the operator's output (its rows are the loop everything else joins)."""
        return sch.get_sblock(workload.op.anchor)

    def default_config(self, workload: Workload) -> Config:
        """Rows in parallel, each split into vectors of the CPU's (:func:`~opbench.hardware.cpu_shape.current_shape`),
        and its reductions kept as one vector of partial sums (a reduction one scalar at a time waits on each add)."""
        lanes = current_shape().fp32_lanes
        return {"inline": 1, "compute_at": "row", "parallel": 1, "inner_split": divisors(self._inner_extent(workload), lanes)[-1],
                "vectorize": 1, "reduce_vector": self._partials(workload, lanes)[-1],
                "unroll_max_step": 16, "unroll_explicit": 0}

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        return {"inline": None, "compute_at": COMPUTE_AT, "parallel": None, "inner_split": None, "vectorize": None,
                "reduce_vector": None, "unroll_max_step": None, "unroll_explicit": None}

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        out = self.output_block(sch, workload)
        producers = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if not sch.get(b).same_as(sch.get(out))]
        if config["inline"]:
            for block in list(producers):
                if not is_reduction(sch, block):
                    sch.compute_inline(block)
                    producers.remove(block)
        lanes = config.get("reduce_vector", 1)
        partial_of = {sch.get(b).name_hint: _partial_results(sch, b, lanes) for b in producers
                      if lanes > 1 and is_reduction(sch, b)}
        names = [sch.get(b).name_hint for b in producers]  # each block of partials just before the reduction of them
        producers = [p for b, name in zip(producers, names) for p in ((partial_of[name], b) if name in partial_of else (b,))]
        partials = {sch.get(p).name_hint for p in partial_of.values()}
        loops = sch.get_loops(out)
        if self.fuse_all:
            row, inner = sch.split(sch.fuse(*loops), [None, config["inner_split"]])
        else:
            row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
            inner = sch.split(loops[-1], [None, config["inner_split"]])[-1]
        if config["compute_at"] == "row":
            for block in reversed(producers):
                sch.compute_at(block, row)
        if config["parallel"]:
            sch.parallel(row)
            if config["compute_at"] == "root":
                for block in producers:
                    if sch.get(block).name_hint in partials:
                        sch.parallel(sch.get_loops(block)[0])  # its rows: the loops below reduce
                    else:
                        parallel_outer(sch, block)
        if config["unroll_max_step"]:
            sch.annotate(row, "pragma_auto_unroll_max_step", config["unroll_max_step"])
            sch.annotate(row, "pragma_unroll_explicit", config["unroll_explicit"])
        if config["vectorize"]:
            if config["inner_split"] > 1:
                sch.vectorize(inner)
            for block in producers:
                if not is_reduction(sch, block):
                    vectorize_inner(sch, block)
        for block in producers:
            if sch.get(block).name_hint in partials:
                _vector_of_partials(sch, block, computed_at_row=config["compute_at"] == "row")
            elif is_reduction(sch, block):
                sch.decompose_reduction(block, sch.get_loops(block)[-1])


def _partial_results(sch: Schedule, block: Any, lanes: int) -> Any:
    """The block of ``lanes`` partial results of ``block``'s reduction (rfactor), which ``block`` then reduces."""
    inner = sch.split(sch.get_loops(block)[-1], [None, lanes])[-1]
    last = len(sch.get(block).writes[0].region)  # the partials of a row side by side
    return sch.rfactor(inner, factor_axis=last)


def _vector_of_partials(sch: Schedule, partial: Any, computed_at_row: bool) -> None:
    """The partial results kept in one vector: initialised and updated a vector at a time. (Computed at a
    row, the block's loops follow its iterators: the partials' loop first, then the reduction's.)"""
    outer, inner = sch.get_loops(partial)[-2:]
    if computed_at_row:
        sch.reorder(inner, outer)
        outer, inner = inner, outer
    sch.vectorize(inner)
    init = sch.decompose_reduction(partial, outer)
    from tvm.tirx import ForKind

    if sch.get(sch.get_loops(init)[-1]).kind != ForKind.VECTORIZED:
        sch.vectorize(sch.get_loops(init)[-1])


@dataclass(frozen=True)
class FusedRowwiseTemplate(RowwiseTemplate):
    """The row-wise template on a model's fused softmax or layer norm (and what Relax fused after it,
    e.g. a broadcast): the output is the function's last block."""

    name: str = "fused_rowwise"
    op: str = "fused_rowwise"  # the operator kind it schedules

    def output_block(self, sch: Schedule, workload: Workload) -> Any:
        return child_blocks(sch)[-1]


@dataclass(frozen=True)
class NoScheduleTemplate(Template):
    """TVM's TE default schedule: the PrimFunc as ``te.create_prim_func`` emits it (no knobs)."""

    name: str = "te_default"

    def knobs(self, workload: Workload) -> list[Knob]:
        return []

    def default_config(self, workload: Workload) -> Config:
        return {}

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        return None
