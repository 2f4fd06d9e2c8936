"""Packed-layout (NCHW[x]c) convolution templates for CPUs, after TVM's x86 ``conv2d_NCHWc``.

The operator keeps its NCHW signature; the template packs inside it, so a standalone catalogue operator counts
every layout transform it needs (``layout_transform=in_op``, its default; ``weights_prepacked``: as a model's)::

    data   NCHW  -> (N, C/ic, H+2p, W+2p, ic)   padding done by the packing copy
    weight OIHW  -> (O/oc, I/ic, R, S, ic, oc)   depthwise: CRS -> (C/c, R, S, c), C1RS -> (C/c, 1, R, S, c)
    conv   n | oc_outer | y_outer | x_outer | reduction | y_inner | x_inner | oc_inner (vectorised)

The accumulator is a register tile of ``oh_block x ow_block x oc_block`` values in the packed order, written back
to NCHW once its reduction is done, in vectors along the output's width (left to LLVM, the write-back of a
3-channel 3x3 stem with its bias and ReLU took gathers over the channels: VGG-16's ran 3.5x slower). On a model's
fused operator (``fused_conv2d_nchwc``) the epilogue (batch norm, bias, residual add, ReLU) is inlined into that
write-back, the prologue (padding) into the data packing; the weight packing is marked as a layout rewrite, which
a model built with the schedule runs once at build time on its constant weights
(:func:`opbench.studies.models.tuned.apply_database`), and a ``weights_prepacked`` trial once before timing it
(activations stay in the op). A catalogue conv packing in the op may pack each output-channel block's slice of the
weight just before it computes that block (``weight_pack_at=oc_block``), while the slice is in cache. Block sizes
are divisors of their extents, so every point of the space applies; channel counts the vector width does not
divide (3, 24, 40) take the divisors they have. The one exception: an output width with no divisor from 4 to 16
(17) also takes column tiles that do not divide it, the last one predicated.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space import depthwise_rows, pointwise, stem_columns, winograd, winograd_fused
from opbench.space._base import Config, Knob, Nest, Template, divisors
from opbench.space._schedule import (
    IN_OP,
    LAYOUT_TRANSFORMS,
    TILE_VECTORS,
    WEIGHTS_PREPACKED,
    default_layout_transform,
    fold_into_write,
    loops_below,
    mark_prepack,
    pack_copy,
    vector_lanes,
    vectorize_lanes,
)
from opbench.space.column_tiles import NARROWEST_TILE, column_tiles, default_register_tile
from opbench.space.tiled import UNROLL_STEPS
from opbench.workloads import Workload
from opbench.workloads.fused import anchor_block, inline_side_blocks

if TYPE_CHECKING:
    from tvm import IRModule
    from tvm.s_tir import Schedule

CHANNEL_BLOCK_CAP = 64
OH_BLOCK_CAP = 4
# where the input-channel loop sits in the reduction: outer chunk (c), window (rs), inner chunk (c)
REDUCE_ORDERS = ("c_rs_c", "rs_c_c", "c_c_rs")
WEIGHT_PACK_AT = ("root", "oc_block")
# Other algorithms, each a module of its own, with its knobs (see _alternative):
ALTERNATIVES = {"winograd": winograd, "gemm": pointwise, "rows": depthwise_rows, "columns": stem_columns}
ALGORITHMS = ("direct", *ALTERNATIVES)
# A catalogue conv with this many output-channel blocks packs its weight block by block by default (resnet50-c5's
# 32 blocks of a 9.4 MB weight: docs/workloads-and-templates.md#packed), parallel over the blocks only.
PACK_PER_BLOCK_MIN_BLOCKS = 8


@dataclass(frozen=True)
class PackedConvTemplate(Template):
    name: str
    op: str  # the operator kind it schedules: conv2d, depthwise_conv2d or fused_conv2d
    depthwise: bool = False
    predicated_columns: bool = True  # column tiles that do not divide the width (a tensorized block takes none)

    def _layout(self, config: Config) -> str:
        """Where ``config`` packs the weight (a config from before the knob: the operator's default)."""
        return config.get("layout_transform", default_layout_transform(self.op))

    @property
    def _block_knob(self) -> str:
        """The knob of the vectorised channel block: output channels (depthwise: the channels)."""
        return "c_block" if self.depthwise else "oc_block"

    def _extents(self, workload: Workload) -> dict[str, int]:
        """From the anchor's loops: n, k (output channels), oh, ow | c (input channels), r, s; a depthwise
        conv's channels are its output channels (its loops: n, k, oh, ow | r, s, or 1, r, s in a model)."""
        spatial = [a.extent for a in workload.axes if not a.reduce]
        reduce = [a.extent for a in workload.axes if a.reduce]
        return {"k": spatial[1], "oh": spatial[2], "ow": spatial[3], "c": spatial[1] if self.depthwise else reduce[0]}

    def knobs(self, workload: Workload) -> list[Knob]:
        ext = self._extents(workload)
        knobs = [Knob(self._block_knob, divisors(ext["k"], CHANNEL_BLOCK_CAP),
                      f"{'channel' if self.depthwise else 'output-channel'} block of the packed layout "
                      f"({ext['k']} channels; the vectorised loop)")]
        knobs.append(Knob("packed_output", (0, 1), "1: the accumulator goes to a packed output that a copy "
                                                   "unpacks; 0: it is written to NCHW directly"))
        in_op = default_layout_transform(self.op) == IN_OP
        if not self.depthwise:
            knobs.append(Knob("ic_block", divisors(ext["c"], CHANNEL_BLOCK_CAP),
                              f"input-channel block of the packed layout ({ext['c']} channels)"))
            knobs.append(Knob("reduce_order", REDUCE_ORDERS, "reduction loop order: input-channel chunks (c) "
                                                             "outside/inside the window (rs)"))
            knobs.append(Knob("weight_pack_at", WEIGHT_PACK_AT if in_op else ("root",),
                              "where the weight is packed in the operator: all of it before the convolution (root), "
                              "or each output-channel block's slice just before that block, in cache (oc_block)"))
        alternative = self._alternative(workload)
        if alternative:
            knobs += [Knob("algorithm", ("direct", alternative), f"direct (packed NCHW[x]c) or {alternative}; the "
                                                                 "other's knobs are ignored"),
                      *ALTERNATIVES[alternative].knobs(workload)]
        knobs += [
            Knob("ow_block", column_tiles(ext["ow"], self.predicated_columns),
                 f"register tile along the output width ({ext['ow']}; where no divisor is {NARROWEST_TILE} or wider, "
                 "the last tile predicated)"),
            Knob("oh_block", divisors(ext["oh"], OH_BLOCK_CAP), f"register tile along the output height ({ext['oh']})"),
            Knob("unroll_window", (0, 1), "unroll the kernel window loops"),
            Knob("parallel", (0, 1, 2, 3), "how many outer loops (batch, channel blocks, output rows) are fused "
                                           "and parallelised"),
            Knob("unroll_max_step", UNROLL_STEPS, "pragma_auto_unroll_max_step on the outer loop"),
            Knob("layout_transform", LAYOUT_TRANSFORMS if in_op else (WEIGHTS_PREPACKED,),
                 "where the weight is packed: in the operator, timed (in_op), or once before (as a model's constant)"),
        ]
        return knobs

    def default_config(self, workload: Workload) -> Config:
        """A register tile of the CPU's vector registers (:func:`~opbench.hardware.cpu_shape.current_shape`):
        :data:`TILE_VECTORS` vectors of output channels (where they divide them, else one vector's worth) by as
        many output columns as the registers beside those weight vectors and the broadcast data value hold, or one
        vector by more columns where that loads less for each FMA
        (:func:`~opbench.space.column_tiles.default_register_tile`,
        docs/workloads-and-templates.md#register-tiles), written to NCHW directly; a depthwise conv
        keeps TVM x86 ``conv2d_NCHWc``'s one vector of channels, also written to NCHW directly."""
        ext, shape = self._extents(workload), current_shape()
        wide = not self.depthwise and ext["k"] % (TILE_VECTORS * shape.fp32_lanes) == 0
        vectors, columns = default_register_tile(ext["ow"], (TILE_VECTORS, 1) if wide else (1,),
                                                 shape, self.predicated_columns)
        ob = vectors * shape.fp32_lanes if wide else divisors(ext["k"], shape.fp32_lanes)[-1]
        config: Config = {self._block_knob: ob, "packed_output": 0, "parallel": 3}
        if not self.depthwise:
            fused = default_layout_transform(self.op) == IN_OP and ext["k"] // ob >= PACK_PER_BLOCK_MIN_BLOCKS
            config.update(ic_block=divisors(ext["c"], shape.fp32_lanes)[-1], reduce_order="c_rs_c",
                          weight_pack_at="oc_block" if fused else "root", parallel=2 if fused else 3)
        config.update(ow_block=columns, oh_block=1,
                      unroll_window=0, unroll_max_step=16, layout_transform=default_layout_transform(self.op))
        alternative = self._alternative(workload)
        if alternative:
            module = ALTERNATIVES[alternative]
            config.update(algorithm=alternative if module.preferred(workload) else "direct",
                          **module.default_config(workload))
        return config

    def other_algorithms(self, workload: Workload, target: str) -> list[Config]:
        """The default with the other of direct and :meth:`_alternative` (the Winograd default's depth rule was
        set on one CPU: docs/workloads-and-templates.md#fused-winograd)."""
        alternative, default = self._alternative(workload), self.default_for(workload, target)
        return [{**default, "algorithm": "direct" if default["algorithm"] == alternative else alternative}
                ] if alternative else []

    def parameters(self, config: Config, workload: Workload) -> Config:
        """The knobs the config's algorithm uses: an alternative's (Winograd's, the GEMM's), or the direct
        convolution's."""
        alternative = self._alternative(workload)
        own = ALTERNATIVES[alternative].KNOBS if alternative else ()
        if alternative and config.get("algorithm") == alternative:  # (a record from before the knob existed: direct)
            return {k: v for k, v in config.items() if k in {*own, "algorithm", "layout_transform"}}
        prepacked = config.get("layout_transform") == WEIGHTS_PREPACKED  # the weight packed whole, outside the op
        return {k: v for k, v in config.items() if k not in own and not (prepacked and k == "weight_pack_at")}

    def nest(self, config: Config, workload: Workload) -> Nest:
        """The register tile ``oh_block x ow_block x`` the channel block (vectorised); the reduction chunk: the
        window times the input-channel block; parallel: the fused outer loops (batch, channel blocks, rows)."""
        if config.get("algorithm") in ALTERNATIVES:
            return ALTERNATIVES[config["algorithm"]].nest(config, workload)
        ext, block = self._extents(workload), config[self._block_knob]
        reduce = math.prod(a.extent for a in workload.axes if a.reduce)
        if not self.depthwise:
            reduce = reduce // ext["c"] * config["ic_block"]
        outer = [workload.axes[0].extent, ext["k"] // block, ext["oh"] // config["oh_block"]]
        vector = vector_lanes(block, current_shape().fp32_lanes)
        return Nest((config["oh_block"], config["ow_block"], block), vector if vector > 1 else 0, reduce,
                    math.prod(outer[: config["parallel"]]))

    def _alternative(self, workload: Workload) -> str:
        """The algorithm the space offers besides the direct one ("" for none): columns on NCHW for a conv of few
        input channels, Winograd on a 3x3 stride-1 conv (a catalogue one's weight transformed in the operator, as it
        is packed; a model's once, at build time), the GEMM on a 1x1 stride-1 conv, rows on NCHW for a stride-1
        depthwise conv."""
        if self.depthwise:
            return "rows" if depthwise_rows.applies(workload) else ""
        for name in ("columns", "winograd") if self.op in ("conv2d", "fused_conv2d") else ():
            if ALTERNATIVES[name].applies(workload):
                return name
        return "gemm" if pointwise.applies(workload) else ""

    def arithmetic_flops(self, config: Config, workload: Workload) -> float:
        if config.get("algorithm") == "winograd":
            return winograd.arithmetic_flops(config, workload)
        return workload.flops

    def schedule(self, workload: Workload, config: Config) -> IRModule:
        if config.get("algorithm") == "winograd":
            return winograd.module(workload, config)
        return super().schedule(workload, config)

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        vocab: dict[str, tuple | None] = dict.fromkeys(
            ("c_block", "oc_block", "ic_block", "ow_block", "oh_block", "unroll_window", "parallel", "unroll_max_step",
             "packed_output"))
        vocab.update(reduce_order=REDUCE_ORDERS, layout_transform=LAYOUT_TRANSFORMS, weight_pack_at=WEIGHT_PACK_AT,
                     algorithm=ALGORITHMS, **dict.fromkeys(winograd.KNOBS), **dict.fromkeys(pointwise.KNOBS[:-1]),
                     gemm_order=pointwise.ORDERS, **dict.fromkeys(depthwise_rows.KNOBS),
                     **dict.fromkeys(stem_columns.KNOBS))
        return vocab

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        if config.get("algorithm") == "winograd":  # a model's fused conv: rebuilt, the config only recorded
            winograd_fused.mark(sch, config)
            return
        if config.get("algorithm") in ALTERNATIVES:
            ALTERNATIVES[config["algorithm"]].apply(sch, config, workload, self._layout(config))
            return
        ob = config[self._block_knob]
        ib = ob if self.depthwise else config["ic_block"]
        conv = anchor_block(sch)
        epilogue = inline_side_blocks(sch, conv)
        data_pack, weight_pack, grouped = self._pack_inputs(sch, conv, ob, ib)
        loops = sch.get_loops(conv)
        n, f, y, x = loops[:4]
        fo, fi = sch.split(f, [None, ob])
        yo, yi = sch.split(y, [None, config["oh_block"]])
        xo, xi = sch.split(x, [None, config["ow_block"]])
        innermost: list = []  # reduction loops inside the channel block's (a dot product's group)
        if self.depthwise:
            window = list(loops[4:])
            reduction = window
        else:
            rc, *window = loops[4:]
            rco, rci, *innermost = sch.split(rc, self._input_channel_split(ib))
            reduction = {"c_rs_c": [rco, *window, rci], "rs_c_c": [*window, rco, rci],
                         "c_c_rs": [rco, rci, *window]}[config["reduce_order"]]
        lanes = self._split_lanes(sch, fi)
        sch.reorder(n, fo, yo, xo, *reduction, yi, xi, *lanes, *innermost)
        unpack, accumulator = self._write_packed(sch, conv, epilogue, config["packed_output"], ob, xo)
        if config["parallel"]:
            outer = [n, fo, yo][: config["parallel"]]
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        if config["unroll_max_step"]:
            sch.annotate(sch.get_loops(conv)[0], "pragma_auto_unroll_max_step", config["unroll_max_step"])
        for loop in window if config["unroll_window"] else []:
            sch.unroll(loop)
        sch.unroll(xi)
        sch.unroll(yi)
        self._vectorize_lanes(sch, lanes)
        init = sch.decompose_reduction(conv, reduction[0])
        self._tensorize_lanes(sch, lanes)
        if ob > 1:  # else the last loops are other axes'
            vectorize_lanes(sch, sch.get_loops(init)[-1])
            self._vectorize_write_back(sch, accumulator, config, xo)
        self._place_packs(sch, conv, config, data_pack, weight_pack, grouped, ob, ib)
        if unpack is not None:
            loops = sch.get_loops(unpack)
            sch.parallel(sch.fuse(*loops[:3]))
            vectorize_lanes(sch, loops[-1])

    def _vectorize_write_back(self, sch: Schedule, accumulator: Any, config: Config, xo: Any) -> None:
        """The register tile's write-back at ``xo`` vectorised: the packed block's lanes, or an NCHW row's columns."""
        vectorize_lanes(sch, sch.get_loops(accumulator)[-1])

    def _input_channel_split(self, ib: int) -> list[int | None]:
        """How the input channels' loop splits: outer chunks, then ``ib`` channels (a dot product: in groups)."""
        return [None, ib]

    def _split_lanes(self, sch: Schedule, block_loop: Any) -> list[Any]:
        """The channel block's loop, split into a dot product's vectors (here: not split)."""
        return [block_loop]

    def _vectorize_lanes(self, sch: Schedule, lanes: list[Any]) -> None:
        """The channel block's loops (:meth:`_split_lanes`') vectorised."""
        vectorize_lanes(sch, lanes[-1])

    def _tensorize_lanes(self, sch: Schedule, lanes: list[Any]) -> None:
        """The channel block's loops computed by a dot-product instruction, once the reduction's init is split off
        (here: not)."""

    def _weight_layout(self, ob: int, ib: int) -> Callable[..., tuple]:
        """The packed weight's index of ``(o, i, r, s)``: (O/ob, I/ib, R, S, ib, ob)."""
        return lambda o, i, r, s: (o // ob, i // ib, r, s, i % ib, o % ob)

    def _pack_weight(self, sch: Schedule, weight_pack: Any, ob: int, ib: int) -> None:
        """The weight's packing copy, all of it at once, in :meth:`_weight_layout`'s order."""
        pack_copy(sch, weight_pack, {0: ob, 1: ib}, (0, 2, 4, 5, 3, 1), parallel=2)

    def _pack_inputs(self, sch: Schedule, conv: Any, ob: int, ib: int) -> tuple[Any, Any, bool]:
        """Copies of the data and the weight in blocked layouts (data NCHW[ib]c; weight O[ob]o..I[ib]i), the
        padding inlined into the data's copy; whether the weight is a grouped (C, 1, R, S) one."""
        prologue = sch.get_producers(conv)  # the padding stage, when there is one
        data_pack = sch.cache_read(conv, 0, "global")
        weight_pack = sch.cache_read(conv, 1, "global")
        sch.transform_layout(conv, ("read", 0), lambda n, c, h, w: (n, c // ib, h, w, c % ib))
        grouped = len(sch.get(conv).iter_vars) == 7  # a model's depthwise conv: weight (C, 1, R, S)
        if self.depthwise and grouped:
            sch.transform_layout(conv, ("read", 1), lambda c, i, r, s: (c // ob, i, r, s, c % ob))
        elif self.depthwise:
            sch.transform_layout(conv, ("read", 1), lambda c, r, s: (c // ob, r, s, c % ob))
        else:
            sch.transform_layout(conv, ("read", 1), self._weight_layout(ob, ib))
        for block in prologue:
            sch.compute_inline(block)
        return data_pack, weight_pack, grouped

    @staticmethod
    def _write_packed(sch: Schedule, conv: Any, epilogue: list[str], packed_output: bool, ob: int, xo: Any
                      ) -> tuple[Any, Any]:
        """The accumulator in the packed output layout at ``xo``, and (with ``packed_output``) a packed
        output unpacked by a copy of its own: (that copy or None, the accumulator)."""
        packed = lambda n, k, y, x: (n, k // ob, y, x, k % ob)
        unpack = sch.cache_write(conv, 0, "global") if packed_output else None
        if unpack is not None:
            sch.transform_layout(conv, ("write", 0), packed)
        accumulator = sch.cache_write(conv, 0, "local")  # takes the packed layout of what it writes
        if not packed_output:
            sch.transform_layout(conv, ("write", 0), packed)
        fold_into_write(sch, epilogue)  # into the copy that writes NCHW: the unpacking, else the write-back
        sch.reverse_compute_at(accumulator, xo)
        return unpack, accumulator

    def _place_packs(self, sch: Schedule, conv: Any, config: Config, data_pack: Any, weight_pack: Any, grouped: bool,
                     ob: int, ib: int) -> None:
        """The packing copies run in the packed order (stores contiguous, the channel block vectorised); the
        weight's at the root (packed once by a model, or a prepacked trial) or, in the operator, per output-channel
        block."""
        per_block = not self.depthwise and config["weight_pack_at"] == "oc_block" and self._layout(config) == IN_OP
        pack_copy(sch, data_pack, {1: ib}, (0, 1, 3, 4, 2), parallel=3)
        if self.depthwise:
            pack_copy(sch, weight_pack, {0: ob}, (0, 2, 3, 4, 1) if grouped else (0, 2, 3, 1), parallel=1)
        elif per_block:  # the loop whose body is one output-channel block
            block_loop = sch.get_loops(conv)[0 if config["parallel"] >= 2 else 1]
            sch.compute_at(weight_pack, block_loop)
            own = loops_below(sch, weight_pack, block_loop)
            if len(own) == 4:  # (o, i, r, s) in the block; a loop of extent 1 is not made, then it stays as made
                o, i, r, s = own
                io, ii = sch.split(i, [None, ib])
                sch.reorder(io, r, s, ii, o)
                vectorize_lanes(sch, o)
        else:
            self._pack_weight(sch, weight_pack, ob, ib)
        if self.depthwise or not per_block:
            mark_prepack(sch, weight_pack)
