"""Multi-level tiling for operators with one reduction anchor block (matmul, dense, conv, pool).

Loop structure after tiling, for tiled spatial axes split in three (S0 outer, S1 middle, S2 inner
register tile) and tiled reduction axes split in two (R0, R1)::

    order=SSRRS:  S0 | S1 | R0 | R1 | S2      (register tile innermost, vectorised)
    order=SSRSR:  S0 | S1 | R0 | S2 | R1
    order=SRSRS:  S0 | R0 | S1 | R1 | S2      (reduction blocked outside the middle tile)
    order=SRSSR:  S0 | R0 | S1 | S2 | R1

Untiled spatial axes (batch) join S0, untiled reduction axes (kernel window) join R1. The first
``parallel`` S0 loops are fused and parallelised. Consumers (the ``cache_write`` copy, bias/average
epilogues) are computed at ``write_at``; the padding producer at ``pad_at``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opbench.exceptions import ConfigError
from opbench.space._base import Config, Knob, Template, axis_extents
from opbench.space._schedule import parallel_outer, vectorize_inner
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

ORDERS = {
    "SSRRS": ("S0", "S1", "R0", "R1", "S2"),
    "SSRSR": ("S0", "S1", "R0", "S2", "R1"),
    "SRSRS": ("S0", "R0", "S1", "R1", "S2"),
    "SRSSR": ("S0", "R0", "S1", "S2", "R1"),
}
INNER_TILES = (1, 2, 4, 8, 16, 32, 64)
MID_TILES = (1, 2, 4, 8, 16, 32)
REDUCE_TILES = (1, 2, 4, 8, 16, 32, 64, 128)
UNROLL_STEPS = (0, 16, 64, 512)
PAD_STAGE = "pad"


def epilogue_name(workload: Workload) -> str | None:
    """The elementwise stage after the anchor (dense's bias, average pooling's division), if any."""
    return {"dense": "bias_add" if workload.params.get("bias") else None,
            "pool2d": "pool_avg" if workload.params.get("kind") == "avg" else None}.get(workload.op.name)


def largest_dividing(choices: tuple[int, ...], extent: int, cap: int) -> int:
    return max(c for c in choices if c <= cap and extent % c == 0)


@dataclass(frozen=True)
class TiledTemplate(Template):
    name: str
    tiled: tuple[str, ...]  # spatial axes split S0/S1/S2
    reduce_tiled: tuple[str, ...] = ()  # reduction axes split R0/R1
    untiled_spatial: int = 0  # leading spatial axes left whole (batch), joining S0
    has_pad: bool = False

    def knobs(self) -> list[Knob]:
        knobs = []
        for a in self.tiled:
            knobs.append(Knob(f"{a}_inner", INNER_TILES, f"register tile of loop {a} (S2)"))
            knobs.append(Knob(f"{a}_mid", MID_TILES, f"middle tile of loop {a} (S1)"))
        knobs += [Knob(f"{r}_inner", REDUCE_TILES, f"inner tile of reduction loop {r} (R1)") for r in self.reduce_tiled]
        knobs += [
            Knob("order", tuple(ORDERS), "loop order of the tile levels (see opbench.space.tiled)"),
            Knob("parallel", tuple(range(self.untiled_spatial + len(self.tiled) + 1)), "how many outer (S0) loops are fused and parallelised"),
            Knob("cache_write", ("none", "local", "global"), "accumulate into a cache buffer of this scope"),
            Knob("write_at", ("root", "outer", "inner"), "where cache copy / epilogue run: own loop nest, after S0, after S1"),
        ]
        if self.has_pad:
            knobs.append(Knob("pad_at", ("inline", "root", "outer"), "padding stage: inlined, own loop nest, or per S0 tile"))
        knobs += [
            Knob("vectorize", (0, 1), "vectorise the innermost spatial loops"),
            Knob("unroll_max_step", UNROLL_STEPS, "pragma_auto_unroll_max_step on the outer loop"),
            Knob("unroll_explicit", (0, 1), "pragma_unroll_explicit: unroll in TIR rather than by LLVM"),
        ]
        return knobs

    def default_config(self, workload: Workload) -> Config:
        ext = axis_extents(workload)
        config: Config = {}
        for idx, a in enumerate(self.tiled):
            cap = 16 if idx == len(self.tiled) - 1 else (4 if idx == len(self.tiled) - 2 else 1)
            config[f"{a}_inner"] = largest_dividing(INNER_TILES, ext[a], cap)
            config[f"{a}_mid"] = 1
        for r in self.reduce_tiled:
            config[f"{r}_inner"] = largest_dividing(REDUCE_TILES, ext[r], 8)
        config.update(order="SSRRS", parallel=self.untiled_spatial + len(self.tiled), cache_write="local", write_at="inner")
        if self.has_pad:
            config["pad_at"] = "outer"
        config.update(vectorize=1, unroll_max_step=64, unroll_explicit=0)
        return config

    def check(self, config: Config, workload: Workload) -> None:
        ext = axis_extents(workload)
        for a in self.tiled:
            inner, mid = config[f"{a}_inner"], config[f"{a}_mid"]
            if inner > ext[a]:
                raise ConfigError(f"{a}_inner", f"tile {inner} exceeds loop {a} of extent {ext[a]}")
            if inner * mid > ext[a]:
                raise ConfigError(f"{a}_mid", f"{a}_inner x {a}_mid = {inner * mid} exceeds loop {a} of extent {ext[a]}")
        for r in self.reduce_tiled:
            if config[f"{r}_inner"] > ext[r]:
                raise ConfigError(f"{r}_inner", f"tile {config[f'{r}_inner']} exceeds loop {r} of extent {ext[r]}")
        has_consumer = config["cache_write"] != "none" or epilogue_name(workload) is not None
        order = ORDERS[config["order"]]
        if has_consumer and config["write_at"] == "inner" and order.index("R0") < order.index("S1"):
            raise ConfigError(
                "write_at",
                f"'inner' needs the S1 loops outside the reduction, but order {config['order']} puts R0 "
                "outside S1 (the consumer would read a partial sum)",
            )

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        block = sch.get_sblock(workload.op.anchor)
        pad = sch.get_sblock(PAD_STAGE) if self.has_pad and workload.params.get("pad") else None
        epilogue = epilogue_name(workload)
        consumer = sch.get_sblock(epilogue) if epilogue else None
        root_stages = []

        if pad is not None and config["pad_at"] == "inline":
            sch.compute_inline(pad)
            pad = None
        if config["cache_write"] != "none":
            copy = sch.cache_write(block, 0, config["cache_write"])
            if consumer is not None:
                sch.reverse_compute_inline(consumer)
            consumer = copy

        groups: dict[str, list] = {g: [] for g in ("S0", "S1", "S2", "R0", "R1")}
        for axis, loop in zip(workload.axes, sch.get_loops(block)):
            name = axis.name
            if name in self.tiled:
                s0, s1, s2 = sch.split(loop, [None, config[f"{name}_mid"], config[f"{name}_inner"]])
                for group, loop_part in zip(("S0", "S1", "S2"), (s0, s1, s2)):
                    groups[group].append(loop_part)
            elif name in self.reduce_tiled:
                r0, r1 = sch.split(loop, [None, config[f"{name}_inner"]])
                groups["R0"].append(r0)
                groups["R1"].append(r1)
            else:
                groups["R1" if axis.reduce else "S0"].append(loop)
        order = ORDERS[config["order"]]
        sch.reorder(*[loop for g in order for loop in groups[g]])

        if consumer is not None:
            if config["write_at"] == "root":
                root_stages.append(consumer)
            else:
                sch.reverse_compute_at(consumer, (groups["S0"] if config["write_at"] == "outer" else groups["S1"])[-1])
        if pad is not None:
            if config["pad_at"] == "outer":
                sch.compute_at(pad, groups["S0"][-1])
            else:
                root_stages.append(pad)

        outer = groups["S0"]
        if config["parallel"]:
            fused = sch.fuse(*outer[: config["parallel"]]) if config["parallel"] > 1 else outer[0]
            sch.parallel(fused)
            outer = [fused]
            for stage in root_stages:
                parallel_outer(sch, stage)
        if config["unroll_max_step"]:
            sch.annotate(outer[0], "pragma_auto_unroll_max_step", config["unroll_max_step"])
            sch.annotate(outer[0], "pragma_unroll_explicit", config["unroll_explicit"])
        if config["vectorize"]:
            if order[-1].startswith("S"):
                vectorize_inner(sch, block, split_long=False)
            for stage in ([consumer] if consumer is not None else []) + ([pad] if pad is not None else []):
                vectorize_inner(sch, stage)
        first_reduce = (groups["R0"] or groups["R1"])[0] if order.index("R0") < order.index("R1") else groups["R1"][0]
        sch.decompose_reduction(block, first_reduce)
