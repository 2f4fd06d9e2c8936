"""The template of a model's fused operators (any PrimFunc): find the anchor block (the one with a
reduction, else the last), inline the elementwise blocks around it, tile its two innermost spatial
loops and its reduction, parallelise the outer loops, vectorise the innermost, unroll."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.exceptions import ConfigError
from opbench.space._base import Config, Knob, Template
from opbench.workloads import Axis, Workload

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

REDUCE = 2  # tirx.IterVar.CommReduce


def _blocks(sch: Schedule) -> list[Any]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _anchor(sch: Schedule) -> Any:
    """The last block with a reduction axis, else the last block."""
    blocks = _blocks(sch)
    reducing = [b for b in blocks if any(int(iv.iter_type) == REDUCE for iv in sch.get(b).iter_vars)]
    return (reducing or blocks)[-1]


def _try(primitive: Any, block: Any) -> bool:
    """Apply a schedule primitive that may not apply here (a ScheduleError leaves the schedule as it was)."""
    from tvm import s_tir

    try:
        primitive(block)
        return True
    except s_tir.ScheduleError:
        return False


def anchor_axes(func: Any) -> list[Axis]:
    """The anchor block's axes of a PrimFunc: spatial first, then reduction, as the template sees them."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    ivs = sch.get(_anchor(sch)).iter_vars
    axes = [Axis(str(iv.var), int(iv.dom.extent), int(iv.iter_type) == REDUCE) for iv in ivs]
    return [a for a in axes if not a.reduce] + [a for a in axes if a.reduce]


@dataclass(frozen=True)
class FusedTemplate(Template):
    name: str = "fused"

    def knobs(self) -> list[Knob]:
        return [
            Knob("inline", (0, 1), "inline the elementwise blocks before and after the anchor into it"),
            Knob("i_inner", (1, 2, 4, 8, 16, 32), "inner tile of the second-innermost spatial loop"),
            Knob("j_inner", (1, 4, 8, 16, 32, 64), "inner tile of the innermost spatial loop (vector width)"),
            Knob("k_inner", (1, 4, 8, 16, 32), "inner tile of the innermost reduction loop"),
            Knob("parallel", (0, 1, 2), "outer tile loops fused and run in parallel (0: serial)"),
            Knob("vectorize", (0, 1), "vectorise the innermost spatial tile"),
            Knob("unroll_max_step", (0, 16, 64, 512), "pragma_auto_unroll_max_step on the outermost loop"),
        ]

    def default_config(self, workload: Workload) -> Config:
        spatial = [a for a in workload.axes if not a.reduce]
        j = max((v for v in (16, 8, 4, 1) if spatial and spatial[-1].extent % v == 0), default=1)
        return {"inline": 1, "i_inner": 1, "j_inner": j, "k_inner": 1, "parallel": 1 if len(spatial) > 1 else 0,
                "vectorize": int(j > 1), "unroll_max_step": 16}

    def check(self, config: Config, workload: Workload) -> None:
        spatial = [a for a in workload.axes if not a.reduce]
        reduce = [a for a in workload.axes if a.reduce]
        for knob, axis in (("j_inner", spatial[-1:]), ("i_inner", spatial[-2:-1]), ("k_inner", reduce[-1:])):
            extent = axis[0].extent if axis else 1
            if extent % config[knob]:
                raise ConfigError(knob, f"tile {config[knob]} does not divide loop {axis[0].name if axis else '-'} "
                                        f"of extent {extent}")
        if config["parallel"] > len(spatial):
            raise ConfigError("parallel", f"{config['parallel']} loops asked, the anchor has {len(spatial)}")
        if config["vectorize"] and config["j_inner"] == 1:
            raise ConfigError("vectorize", "needs j_inner > 1 (the vectorised tile)")

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        anchor = _anchor(sch)
        name = sch.get(anchor).name_hint
        epilogues = []  # consumers of the anchor that cannot be inlined: computed per outer tile instead
        if config["inline"]:
            for block in _blocks(sch):
                if sch.get(block).name_hint == name:
                    continue
                if not any(_try(inline, block) for inline in (sch.compute_inline, sch.reverse_compute_inline)):
                    if any(sch.get(c).name_hint == sch.get(block).name_hint for c in sch.get_consumers(anchor)):
                        epilogues.append(block)
        loops, ivs = sch.get_loops(anchor), sch.get(anchor).iter_vars
        spatial = [l for l, iv in zip(loops, ivs) if int(iv.iter_type) != REDUCE]
        reduce = [l for l, iv in zip(loops, ivs) if int(iv.iter_type) == REDUCE]
        inner_spatial, tiled = [], list(spatial)
        if spatial:
            j_outer, j_inner = sch.split(spatial[-1], [None, config["j_inner"]])
            tiled[-1], inner_spatial = j_outer, [j_inner]
        if len(spatial) > 1:
            i_outer, i_inner = sch.split(spatial[-2], [None, config["i_inner"]])
            tiled[-2], inner_spatial = i_outer, [i_inner, *inner_spatial]
        reduce_order = list(reduce)
        if reduce:
            k_outer, k_inner = sch.split(reduce[-1], [None, config["k_inner"]])
            reduce_order[-1:] = [k_outer, k_inner]
        sch.reorder(*tiled, *reduce_order, *inner_spatial)
        for epilogue in epilogues:  # where it reads only its own tile of the anchor's output
            _try(lambda block: sch.reverse_compute_at(block, tiled[-1]), epilogue)
        if config["parallel"]:
            sch.parallel(sch.fuse(*tiled[:config["parallel"]]) if config["parallel"] > 1 else tiled[0])
        if config["vectorize"] and inner_spatial:
            sch.vectorize(inner_spatial[-1])
        if reduce:  # last: TVM wants parallel and vectorize before decompose_reduction
            sch.decompose_reduction(anchor, reduce_order[0])
        if config["unroll_max_step"]:
            sch.annotate(sch.get_loops(anchor)[0], "pragma_auto_unroll_max_step", config["unroll_max_step"])
