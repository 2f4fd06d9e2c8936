"""The template of a model's fused operators (any PrimFunc): find the anchor block (the one with a
reduction, else the last), inline the elementwise blocks around it, tile its two innermost spatial
loops and its reduction, parallelise the outer loops, vectorise the innermost, unroll."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.exceptions import ConfigError
from opbench.space._base import Config, Knob, Template
from opbench.workloads import Workload
from opbench.workloads.fused import REDUCE, anchor_block, child_blocks

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

def _try(primitive: Any, block: Any) -> bool:
    """Apply a schedule primitive that may not apply here (a ScheduleError leaves the schedule as it was)."""
    from tvm import s_tir

    try:
        primitive(block)
        return True
    except s_tir.ScheduleError:
        return False


def tile(extent: int, bound: int) -> int:
    """The largest divisor of ``extent`` not above ``bound``: every tile knob fits every shape."""
    return max(d for d in range(1, min(extent, bound) + 1) if extent % d == 0)


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

    def knobs(self) -> list[Knob]:
        bound = "(at most: the largest divisor of the loop's extent not above it)"
        return [
            Knob("inline", (0, 1), "inline the elementwise blocks before and after the anchor into it"),
            Knob("i_inner", (1, 2, 4, 8, 16, 32), f"inner tile of the largest other spatial loop {bound}"),
            Knob("j_inner", (1, 4, 8, 16, 32, 64), f"inner tile of the innermost spatial loop, vectorised {bound}"),
            Knob("k_inner", (1, 4, 8, 16, 32), f"inner tile of the largest reduction loop {bound}"),
            Knob("parallel", (0, 1, 2), "outer loops fused and run in parallel (0: serial)"),
            Knob("vectorize", (0, 1), "vectorise the innermost spatial tile"),
            Knob("unroll_max_step", (0, 16, 64, 512), "pragma_auto_unroll_max_step on the outermost loop"),
        ]

    def default_config(self, workload: Workload) -> Config:
        spatial = [a for a in workload.axes if not a.reduce]
        return {"inline": 1, "i_inner": 1, "j_inner": 16, "k_inner": 1, "parallel": min(len(spatial), 2),
                "vectorize": 1, "unroll_max_step": 16}

    def check(self, config: Config, workload: Workload) -> None:
        spatial = [a for a in workload.axes if not a.reduce]
        if config["parallel"] > len(spatial):
            raise ConfigError("parallel", f"{config['parallel']} loops asked, the anchor has {len(spatial)}")

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        anchor = anchor_block(sch)
        name = sch.get(anchor).name_hint
        epilogues = []  # consumers of the anchor that cannot be inlined: computed per outer tile instead
        if config["inline"]:
            for block in child_blocks(sch):
                if sch.get(block).name_hint == name:
                    continue
                inlined = any(_try(inline, block) for inline in (sch.compute_inline, sch.reverse_compute_inline))
                if not inlined and any(sch.get(c).name_hint == sch.get(block).name_hint for c in sch.get_consumers(anchor)):
                    epilogues.append(block)
        loops, ivs = sch.get_loops(anchor), sch.get(anchor).iter_vars
        spatial = [(l, int(iv.dom.extent)) for l, iv in zip(loops, ivs) if int(iv.iter_type) != REDUCE]
        reduce = [(l, int(iv.dom.extent)) for l, iv in zip(loops, ivs) if int(iv.iter_type) == REDUCE]
        i, j, k = roles([e for _, e in spatial], [e for _, e in reduce])
        outer, inner = [l for l, _ in spatial], []
        for index, knob in ((i, "i_inner"), (j, "j_inner")):
            if index is not None:
                loop, extent = spatial[index]
                outer[index], tile_loop = sch.split(loop, [None, tile(extent, config[knob])])
                inner.append(tile_loop)
        reduce_order = [l for l, _ in reduce]
        if k is not None:
            reduce_order[k], k_inner = sch.split(reduce[k][0], [None, tile(reduce[k][1], config["k_inner"])])
            reduce_order.append(k_inner)
        sch.reorder(*outer, *reduce_order, *inner)
        for epilogue in epilogues:  # where it reads only its own tile of the anchor's output
            _try(lambda block: sch.reverse_compute_at(block, outer[-1]), epilogue)
        if config["parallel"]:
            sch.parallel(sch.fuse(*outer[:config["parallel"]]) if config["parallel"] > 1 else outer[0])
        if config["vectorize"] and j is not None and tile(spatial[j][1], config["j_inner"]) > 1:
            sch.vectorize(inner[-1])
        if reduce:  # last: TVM wants parallel and vectorize before decompose_reduction
            sch.decompose_reduction(anchor, reduce_order[0])
        if config["unroll_max_step"]:
            sch.annotate(sch.get_loops(anchor)[0], "pragma_auto_unroll_max_step", config["unroll_max_step"])
