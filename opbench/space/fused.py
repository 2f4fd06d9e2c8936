"""The template of a model's fused operators (any PrimFunc): find the anchor block (the one with a
reduction, else the last), inline the elementwise blocks around it, tile its two innermost spatial
loops and its reduction, parallelise the outer loops, vectorise the innermost, unroll.

A pooling window (max or average) may instead take its padding as each channel's padded plane, computed in cache
(``padding=plane``, its default). Padded, or over rows at least a vector wide, it leaves its loops scalar by default,
the window unrolled innermost, which LLVM's loop vectoriser turns into interleaved loads: TVM vectorises a stride-2
window's reads as gathers, lane by lane (docs/workloads-and-templates.md#pooling-windows)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opbench.exceptions import ConfigError
from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Template, divisors
from opbench.space._schedule import padded_planes, try_primitive
from opbench.workloads import Workload
from opbench.workloads.fused import REDUCE, anchor_block, child_blocks

PADDING = ("inline", "plane")

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

def perfect(factor: int, extent: int, knob: str) -> int:
    """``factor``, checked to divide the loop it tiles (the space is derived from the same loops)."""
    if extent % factor:
        raise ConfigError(knob, f"{factor} does not divide the anchor's loop of extent {extent}")
    return factor


def roles(spatial: list[int], reduce: list[int]) -> tuple[int | None, int | None, int | None]:
    """Indices of the loops to tile: j the innermost spatial (vectorised), i the largest other
    spatial one (a matmul's rows, a convolution's output channels), k the largest reduction."""
    j = len(spatial) - 1 if spatial else None
    others = list(range(len(spatial) - 1))
    i = max(others, key=lambda n: (spatial[n], n)) if others else None
    k = max(range(len(reduce)), key=lambda n: (reduce[n], n)) if reduce else None
    return i, j, k


@dataclass(frozen=True)
class FusedTemplate(Template):
    name: str = "fused"

    def knobs(self, workload: Workload) -> list[Knob]:
        spatial = [a.extent for a in workload.axes if not a.reduce]
        reduce = [a.extent for a in workload.axes if a.reduce]
        i, j, k = roles(spatial, reduce)
        knobs = [Knob("inline", (0, 1), "inline the elementwise blocks before and after the anchor into it")]
        for index, extents, name, cap, what in ((i, spatial, "i_inner", 32, "the largest other spatial loop"),
                                                (j, spatial, "j_inner", 64, "the innermost spatial loop, vectorised"),
                                                (k, reduce, "k_inner", 32, "the largest reduction loop")):
            if index is not None:
                knobs.append(Knob(name, divisors(extents[index], cap), f"inner tile of {what} ({extents[index]})"))
        knobs += [
            Knob("parallel", tuple(range(min(len(spatial), 2) + 1)), "outer loops fused and run in parallel (0: serial)"),
            Knob("vectorize", (0, 1), "vectorise the innermost spatial tile"),
            Knob("unroll_max_step", (0, 16, 64, 512), "pragma_auto_unroll_max_step on the outermost loop"),
        ]
        if workload.op.pool_window(workload.params) == "padded":
            knobs.append(Knob("padding", PADDING, "the pooling window's padding: inlined into its reads (a condition "
                                                "each), or each channel's padded plane in cache"))
        return knobs

    def default_config(self, workload: Workload) -> Config:
        knobs = {k.name: k.choices for k in self.knobs(workload)}
        config: Config = {"inline": 1, "parallel": knobs["parallel"][-1], "vectorize": 1, "unroll_max_step": 16}
        if "i_inner" in knobs:
            config["i_inner"] = 1
        if "j_inner" in knobs:
            config["j_inner"] = max(d for d in knobs["j_inner"] if d <= 16)
        if "k_inner" in knobs:
            config["k_inner"] = 1
        window, row = workload.op.pool_window(workload.params), [a.extent for a in workload.axes if not a.reduce][-1]
        if window == "padded" or (window and row >= current_shape().fp32_lanes):
            config.update(j_inner=1, vectorize=0)  # scalar, for LLVM's loop vectoriser (module docstring)
        if "padding" in knobs:
            config["padding"] = "plane"
        return config

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        return {**dict.fromkeys(("inline", "i_inner", "j_inner", "k_inner", "parallel", "vectorize", "unroll_max_step")),
                "padding": PADDING}

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        anchor = anchor_block(sch)
        name = sch.get(anchor).name_hint
        epilogues = []  # consumers of the anchor that cannot be inlined: computed per outer tile instead
        planes = sch.get_producers(anchor) if config.get("padding") == "plane" else []
        kept = {name, *(sch.get(block).name_hint for block in planes)}
        if config["inline"]:
            for block in child_blocks(sch):
                if sch.get(block).name_hint in kept:
                    continue
                inlined = any(try_primitive(inline, block) for inline in (sch.compute_inline, sch.reverse_compute_inline))
                if not inlined and any(sch.get(c).name_hint == sch.get(block).name_hint for c in sch.get_consumers(anchor)):
                    epilogues.append(block)
        loops, ivs = sch.get_loops(anchor), sch.get(anchor).iter_vars
        if not loops:  # a scalar's (a quantized model's scale and zero point): no loop to schedule
            return
        spatial = [(l, int(iv.dom.extent)) for l, iv in zip(loops, ivs) if int(iv.iter_type) != REDUCE]
        reduce = [(l, int(iv.dom.extent)) for l, iv in zip(loops, ivs) if int(iv.iter_type) == REDUCE]
        i, j, k = roles([e for _, e in spatial], [e for _, e in reduce])
        outer, inner = [l for l, _ in spatial], []
        for index, knob in ((i, "i_inner"), (j, "j_inner")):
            if index is not None:
                loop, extent = spatial[index]
                outer[index], tile_loop = sch.split(loop, [None, perfect(config[knob], extent, knob)])
                inner.append(tile_loop)
        reduce_order = [l for l, _ in reduce]
        if k is not None:
            reduce_order[k], k_inner = sch.split(reduce[k][0], [None, perfect(config["k_inner"], reduce[k][1], "k_inner")])
            reduce_order.append(k_inner)
        sch.reorder(*outer, *reduce_order, *inner)
        for epilogue in epilogues:  # where it reads only its own tile of the anchor's output
            try_primitive(lambda block: sch.reverse_compute_at(block, outer[-1]), epilogue)
        if planes:  # a pooling window's loops: n, c, ...
            padded_planes(sch, planes, outer[1])
        if config["parallel"]:
            sch.parallel(sch.fuse(*outer[:config["parallel"]]) if config["parallel"] > 1 else outer[0])
        if config["vectorize"] and j is not None and config["j_inner"] > 1:
            sch.vectorize(inner[-1])
        if reduce:  # last: TVM wants parallel and vectorize before decompose_reduction
            sch.decompose_reduction(anchor, reduce_order[0])
        if config["unroll_max_step"]:
            sch.annotate(sch.get_loops(anchor)[0], "pragma_auto_unroll_max_step", config["unroll_max_step"])
