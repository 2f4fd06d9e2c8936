"""CUDA templates for ops with one reduction anchor (matmul, batch_matmul, dense, conv2d).

Each tiled spatial axis ``a`` is split into block / thread / register tiles (``a_thread``,
``a_inner``), each tiled reduction axis into an outer and inner part (``r_inner``)::

    blockIdx.x = fuse(batch, a0 blocks...) | threadIdx.x = fuse(a threads...) | r outer | r inner | a inner

The output accumulates in registers (a ``local`` cache) written back per thread. With ``shared``,
every input tile is staged in shared memory once per outer reduction step, fetched cooperatively
by all threads of the block in ``vector``-wide loads. ``unroll_max_step`` unrolls the thread's body.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opbench.exceptions import ConfigError
from opbench.space._base import Config, Knob, Template, axis_extents
from opbench.space.tiled import PAD_STAGE, UNROLL_STEPS, epilogue_name, largest_dividing
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

THREAD_TILES = (1, 2, 4, 8, 16, 32)
REGISTER_TILES = (1, 2, 4, 8)
REDUCE_TILES = (1, 2, 4, 8, 16, 32)
VECTOR_WIDTHS = (1, 2, 4)
MAX_THREADS = 1024  # per block, on every CUDA GPU


@dataclass(frozen=True)
class GpuTiledTemplate(Template):
    name: str
    op: str  # the operator it schedules
    tiled: tuple[str, ...]
    reduce_tiled: tuple[str, ...]
    has_pad: bool = False

    def knobs(self) -> list[Knob]:
        knobs = []
        for a in self.tiled:
            knobs.append(Knob(f"{a}_thread", THREAD_TILES, f"threads along loop {a} (threadIdx.x is their product)"))
            knobs.append(Knob(f"{a}_inner", REGISTER_TILES, f"register tile of loop {a}, per thread"))
        knobs += [Knob(f"{r}_inner", REDUCE_TILES, f"inner tile of reduction loop {r} (the shared-memory step)")
                  for r in self.reduce_tiled]
        knobs += [
            Knob("shared", (0, 1), "stage input tiles in shared memory, fetched by all threads of the block"),
            Knob("vector", VECTOR_WIDTHS, "width of the vectorised loads of the shared-memory fetch"),
            Knob("unroll_max_step", UNROLL_STEPS, "pragma_auto_unroll_max_step on the thread's loop"),
        ]
        return knobs

    def default_config(self, workload: Workload) -> Config:
        ext = axis_extents(workload)
        config: Config = {}
        for idx, a in enumerate(reversed(self.tiled)):  # innermost axis: 16 threads, the next: 8
            thread = largest_dividing(THREAD_TILES, ext[a], (16, 8)[idx] if idx < 2 else 1)
            config[f"{a}_thread"] = thread
            config[f"{a}_inner"] = largest_dividing(REGISTER_TILES, ext[a] // thread, 4 if idx < 2 else 1)
        for r in self.reduce_tiled:
            config[f"{r}_inner"] = largest_dividing(REDUCE_TILES, ext[r], 8)
        config.update(shared=1, vector=1, unroll_max_step=64)
        return config

    def check(self, config: Config, workload: Workload) -> None:
        ext = axis_extents(workload)
        for a in self.tiled:
            tile = config[f"{a}_thread"] * config[f"{a}_inner"]
            if ext[a] % tile:
                raise ConfigError(f"{a}_inner", f"{a}_thread x {a}_inner = {tile} does not divide loop {a} "
                                                f"of extent {ext[a]}")
        for r in self.reduce_tiled:
            if ext[r] % config[f"{r}_inner"]:
                raise ConfigError(f"{r}_inner", f"{config[f'{r}_inner']} does not divide loop {r} of extent {ext[r]}")
        threads = math.prod(config[f"{a}_thread"] for a in self.tiled)
        if threads > MAX_THREADS:
            raise ConfigError(f"{self.tiled[-1]}_thread", f"{threads} threads per block exceed {MAX_THREADS}")

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        block = sch.get_sblock(workload.op.anchor)
        if self.has_pad and workload.params.get("pad"):
            sch.compute_inline(sch.get_sblock(PAD_STAGE))
        write_back = sch.cache_write(block, 0, "local")
        epilogue = epilogue_name(workload)
        if epilogue:
            sch.reverse_compute_inline(sch.get_sblock(epilogue))

        groups: dict[str, list] = {g: [] for g in ("block", "thread", "R0", "R1", "inner")}
        for axis, loop in zip(workload.axes, sch.get_loops(block)):
            if axis.name in self.tiled:
                b, t, i = sch.split(loop, [None, config[f"{axis.name}_thread"], config[f"{axis.name}_inner"]])
                for group, part in zip(("block", "thread", "inner"), (b, t, i)):
                    groups[group].append(part)
            elif axis.name in self.reduce_tiled:
                r0, r1 = sch.split(loop, [None, config[f"{axis.name}_inner"]])
                groups["R0"].append(r0)
                groups["R1"].append(r1)
            else:
                groups["R1" if axis.reduce else "block"].append(loop)
        sch.reorder(*[loop for g in groups.values() for loop in g])
        bx = sch.fuse(*groups["block"])
        tx = sch.fuse(*groups["thread"])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.reverse_compute_at(write_back, tx)
        threads = int(sch.get(tx).extent)
        if config["shared"]:
            for index in range(len(sch.get(block).reads)):
                self._stage_in_shared(sch, block, index, groups["R0"][-1], threads, config["vector"])
        if config["unroll_max_step"]:
            sch.annotate(tx, "pragma_auto_unroll_max_step", config["unroll_max_step"])
            sch.annotate(tx, "pragma_unroll_explicit", 1)
        sch.decompose_reduction(block, groups["R0"][0])

    @staticmethod
    def _stage_in_shared(sch: Schedule, block, index: int, at, threads: int, vector: int) -> None:
        """Copy read ``index`` of ``block`` into shared memory at loop ``at``, by all ``threads`` of the block."""
        stage = sch.cache_read(block, index, "shared")
        sch.compute_at(stage, at)
        loops = sch.get_loops(stage)
        depth = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(at))) + 1
        fused = sch.fuse(*loops[depth:])
        if vector == 1:  # the last round of the fetch may leave threads idle (a predicate)
            sch.bind(sch.split(fused, [None, threads])[1], "threadIdx.x")
            return
        size = int(sch.get(fused).extent)
        if size % (threads * vector):
            raise ConfigError("vector", f"a shared tile of {size} elements does not split into {threads} threads x "
                                        f"{vector}-wide loads")
        _, t, v = sch.split(fused, [None, threads, vector])
        sch.bind(t, "threadIdx.x")
        sch.vectorize(v)


GPU_TEMPLATES = (
    GpuTiledTemplate("cuda_matmul", "matmul", tiled=("i", "j"), reduce_tiled=("k",)),
    GpuTiledTemplate("cuda_batch_matmul", "batch_matmul", tiled=("i", "j"), reduce_tiled=("k",)),
    GpuTiledTemplate("cuda_dense", "dense", tiled=("i", "j"), reduce_tiled=("k",)),
    GpuTiledTemplate("cuda_conv2d", "conv2d", tiled=("f", "y", "x"), reduce_tiled=("rc",), has_pad=True),
)
