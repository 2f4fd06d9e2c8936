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

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import CpuShape, current_shape
from opbench.space._base import SPLIT_SEP, Config, Knob, Nest, Template, divisors, split_choices, split_factors
from opbench.space._schedule import TILE_VECTORS, parallel_outer, tile_vector_width, vectorize_inner
from opbench.workloads import Workload, numpy_dtype
from opbench.workloads._base import Axis

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

ORDERS = {
    "SSRRS": ("S0", "S1", "R0", "R1", "S2"),
    "SSRSR": ("S0", "S1", "R0", "S2", "R1"),
    "SRSRS": ("S0", "R0", "S1", "R1", "S2"),
    "SRSSR": ("S0", "R0", "S1", "S2", "R1"),
}
WRITE_AT = ("root", "outer", "inner")
CACHE_WRITE = ("none", "local", "global")
PAD_AT = ("inline", "root", "outer")
INNER_TILE_CAP = 64  # register tile (S2)
MID_TILE_CAP = 32  # middle tile (S1)
REDUCE_TILE_CAP = 128  # inner reduction tile (R1)
UNROLL_STEPS = (0, 16, 64, 512)
PAD_STAGE = "pad"
NEST_SEP = ":"
WINDOW_ROWS = 4  # a window operator's default register tile rows (each one vector of columns)
MATMUL_MIDDLE_TILE = (16, 4)  # a matmul's default middle tile, in register tiles: columns, rows
WIDE_MIDDLE_TILE = (2, 16)  # the same, for a register tile of TILE_VECTORS vectors
PAGE_BYTES = 4096  # L1 set index bits lie within the 4 KiB page


def epilogue_name(workload: Workload) -> str | None:
    """The elementwise stage after the anchor (dense's bias, average pooling's division), if any."""
    return {"dense": "bias_add" if workload.params.get("bias") else None,
            "pool2d": "pool_avg" if workload.params.get("kind") == "avg" else None}.get(workload.op.name)



def default_tiles(window: bool, wide: bool, shape: CpuShape) -> dict[int, tuple[int, int]]:
    """(inner, middle) caps of the tiled loops, innermost first (others stay whole in S0). A window
    operator's register tile: one vector of ``shape`` by :data:`WINDOW_ROWS` rows. A matmul's: as many rows
    as the accumulators hold for its columns, :data:`TILE_VECTORS` vectors of them (``wide``: its right
    operand's columns are contiguous) in middle tiles of :data:`WIDE_MIDDLE_TILE`, else one vector in
    middle tiles of :data:`MATMUL_MIDDLE_TILE`."""
    if window:
        return {0: (shape.fp32_lanes, 1), 1: (WINDOW_ROWS, 1)}
    vectors, (columns, rows) = (TILE_VECTORS, WIDE_MIDDLE_TILE) if wide else (1, MATMUL_MIDDLE_TILE)
    return {0: (vectors * shape.fp32_lanes, columns), 1: (shape.accumulator_registers // vectors, rows)}


def alias_free_rows(row_bytes: int, cap: int, l1d_ways: int) -> int:
    """The most rows (up to ``cap``) of a row-major operand, ``row_bytes`` apart, that a register tile
    can read at once without more than ``l1d_ways`` of them falling in one L1 set: rows a multiple
    of 4 KiB apart all share a set (4K aliasing)."""
    period = PAGE_BYTES // math.gcd(row_bytes, PAGE_BYTES)  # rows until the set offset repeats
    return max(1, min(cap, l1d_ways * period))


def nest_choices() -> tuple[str, ...]:
    """``order:write_at`` pairs whose consumer sees a finished sum: ``inner`` (after S1) only where
    the S1 loops are outside the reduction."""
    return tuple(f"{order}{NEST_SEP}{at}" for order, levels in ORDERS.items() for at in WRITE_AT
                 if at != "inner" or levels.index("S1") < levels.index("R0"))


@dataclass(frozen=True)
class TiledTemplate(Template):
    name: str
    tiled: tuple[str, ...]  # spatial axes split S0/S1/S2
    reduce_tiled: tuple[str, ...] = ()  # reduction axes split R0/R1
    untiled_spatial: int = 0  # leading spatial axes left whole (batch), joining S0
    has_pad: bool = False
    contiguous_columns: bool = True  # a matmul's right operand is read along its columns (dense's is not)

    def axes(self, workload: Workload) -> list[Axis]:
        """The anchor's loops under the names the knobs use (a catalogue op's own)."""
        return workload.axes

    def untiled(self, workload: Workload) -> int:
        """How many leading spatial loops stay whole (batch)."""
        return self.untiled_spatial

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any, Any]:
        """The anchor block, its padding producer and its elementwise consumer (None where absent)."""
        pad = sch.get_sblock(PAD_STAGE) if self.has_pad and workload.op.has_pad_stage(workload.params) else None
        epilogue = epilogue_name(workload)
        return sch.get_sblock(workload.op.anchor), pad, sch.get_sblock(epilogue) if epilogue else None

    def knobs(self, workload: Workload) -> list[Knob]:
        ext = {a.name: a.extent for a in self.axes(workload)}
        knobs = [Knob(f"{a}_split", split_choices(ext[a], (MID_TILE_CAP, INNER_TILE_CAP)),
                      f"loop {a} ({ext[a]}) as S0 x S1 (middle tile) x S2 (register tile)") for a in self.tiled]
        knobs += [Knob(f"{r}_inner", divisors(ext[r], REDUCE_TILE_CAP), f"inner tile of reduction loop {r} (R1)")
                  for r in self.reduce_tiled]
        knobs += [
            Knob("order", nest_choices(), "loop order of the tile levels : where the cache copy / epilogue runs "
                                          "(root: own loop nest, outer: after S0, inner: after S1)"),
            Knob("parallel", tuple(range(self.untiled(workload) + len(self.tiled) + 1)),
                 "how many outer (S0) loops are fused and parallelised"),
            Knob("cache_write", CACHE_WRITE, "accumulate into a cache buffer of this scope"),
        ]
        if self.has_pad and workload.op.has_pad_stage(workload.params):
            knobs.append(Knob("pad_at", PAD_AT, "padding stage: inlined, own loop nest, or per S0 tile"))
        knobs += [
            Knob("vectorize", (0, 1), "vectorise the innermost spatial loops"),
            Knob("unroll_max_step", UNROLL_STEPS, "pragma_auto_unroll_max_step on the outer loop"),
            Knob("unroll_explicit", (0, 1), "pragma_unroll_explicit: unroll in TIR rather than by LLVM"),
        ]
        return knobs

    def default_config(self, workload: Workload) -> Config:
        """Shaped by the CPU's vectors (:func:`default_tiles`). A window operator's (conv, pool): a register
        tile of 4 rows x one vector of columns (the last two tiled loops), accumulated in a local cache. A
        matmul whose right operand's columns are contiguous: a register tile of two vectors of columns by 8
        rows (AVX-512), 16 tiles of rows by 2 of columns in a parallel block, each tile summing the whole
        reduction (``SSRRS``) into the output itself, explicitly unrolled; dense (its weight read across
        rows) keeps one vector by 16 rows in middle tiles of 4 x 16, visited per reduction chunk (``SRSRS``).
        Fewer rows where the left operand's rows would alias in L1 (:func:`alias_free_rows`)
        (docs/workloads-and-templates.md#register-tiles)."""
        ext, shape = {a.name: a.extent for a in self.axes(workload)}, current_shape()
        wide = not self.has_pad and self.contiguous_columns
        tiles = default_tiles(self.has_pad, wide, shape)
        if not self.has_pad and self.reduce_tiled:
            row_bytes = ext[self.reduce_tiled[0]] * numpy_dtype(workload.dtype).itemsize
            tiles[1] = (alias_free_rows(row_bytes, tiles[1][0], shape.l1d_ways), tiles[1][1])
        config: Config = {}
        for idx, a in enumerate(self.tiled):
            inner_cap, mid_cap = tiles.get(len(self.tiled) - 1 - idx, (1, 1))  # 0: the innermost (vectorised) loop
            inner = divisors(ext[a], inner_cap)[-1]
            count = ext[a] // inner
            mid = divisors(count, mid_cap)[-1]
            config[f"{a}_split"] = SPLIT_SEP.join(map(str, (count // mid, mid, inner)))
        config.update({f"{r}_inner": divisors(ext[r], 8 if self.has_pad else REDUCE_TILE_CAP)[-1] for r in self.reduce_tiled})
        config["parallel"] = self.untiled(workload) + len(self.tiled)
        if self.has_pad:
            config.update(order=f"SSRRS{NEST_SEP}inner", cache_write="local", unroll_max_step=64, unroll_explicit=0)
        else:
            order = "SRSRS" if self.reduce_tiled and not wide else "SSRRS"
            config.update(order=f"{order}{NEST_SEP}outer", cache_write="none", unroll_max_step=512, unroll_explicit=1)
        if self.has_pad and workload.op.has_pad_stage(workload.params):
            config["pad_at"] = "outer"
        config["vectorize"] = 1
        return config

    def parameters(self, config: Config, workload: Workload) -> Config:
        params = {k: v for k, v in config.items() if not k.endswith("_split") and k != "order"}
        for a in self.tiled:
            _, params[f"{a}_mid"], params[f"{a}_inner"] = split_factors(config[f"{a}_split"])
        params["order"], params["write_at"] = config["order"].split(NEST_SEP)
        return params

    def nest(self, config: Config, workload: Workload) -> Nest:
        """The register tile: the S2 tiles, the last one vectorised where the order puts S2 innermost; the
        reduction chunk: the R1 loops; parallel: the fused S0 loops."""
        params = self.parameters(config, workload)
        outer, reduce = [], 1
        for axis in self.axes(workload):
            if axis.name in self.tiled:
                outer.append(-(-axis.extent // (params[f"{axis.name}_mid"] * params[f"{axis.name}_inner"])))
            elif axis.name in self.reduce_tiled:
                reduce *= params[f"{axis.name}_inner"]
            elif axis.reduce:
                reduce *= axis.extent
            else:
                outer.append(axis.extent)
        tile = tuple(params[f"{a}_inner"] for a in self.tiled)
        vectorised = params["vectorize"] and ORDERS[params["order"]][-1] == "S2"
        vector = tile_vector_width(tile[-1], current_shape().fp32_lanes) if vectorised else 0
        return Nest(tile, vector, reduce, math.prod(outer[: params["parallel"]]))

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        vocab: dict[str, tuple | None] = {f"{a}_{level}": None for a in self.tiled for level in ("mid", "inner")}
        vocab.update({f"{r}_inner": None for r in self.reduce_tiled})
        vocab.update(order=tuple(ORDERS), write_at=WRITE_AT, parallel=None, cache_write=CACHE_WRITE, vectorize=None,
                     unroll_max_step=None, unroll_explicit=None)
        if self.has_pad:
            vocab["pad_at"] = PAD_AT
        return vocab

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        config = self.parameters(config, workload)
        block, pad, consumer = self.stages(sch, workload)
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
        for axis, loop in zip(self.axes(workload), sch.get_loops(block)):
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
