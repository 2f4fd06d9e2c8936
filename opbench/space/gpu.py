"""CUDA templates for ops with one reduction anchor (matmul, batch_matmul, dense, conv2d), and for a
model's fused matmuls and convolutions (their producers inlined into the anchor's reads, their
epilogue into its write-back, the anchor's loops named as the catalogue op's).

Each tiled spatial axis ``a`` is split into block / thread / register tiles (``a_thread``,
``a_inner``), each tiled reduction axis into an outer and inner part (``r_inner``)::

    blockIdx.x = fuse(batch, a0 blocks...) | threadIdx.x = fuse(a threads...) | r outer | r inner | a inner

The output accumulates in registers (a ``local`` cache) written back per thread. With ``shared``,
every input tile is staged in shared memory once per outer reduction step, fetched cooperatively
by all threads of the block in ``vector``-wide loads; a config whose staged tiles overflow a block's static
shared memory (a strided convolution's input tile spans stride x its output tile) is invalid, and the
default takes smaller register tiles, or no staging, where its tiles would. ``unroll_max_step`` unrolls
the thread's body.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.exceptions import ConfigError
from opbench.space._base import SPLIT_SEP, Config, Knob, Template, divisors, split_choices, split_factors
from opbench.space._schedule import inline_around_anchor
from opbench.space.tiled import PAD_STAGE, UNROLL_STEPS, epilogue_name
from opbench.workloads import Workload
from opbench.workloads._base import Axis

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

THREAD_CAPS = {1: (1024,), 2: (32, 32), 3: (16, 8, 8)}  # threads per tiled axis: their product fits a block
REGISTER_TILE_CAP = 8
REDUCE_TILE_CAP = 32
VECTOR_WIDTHS = (1, 2, 4)
MAX_THREADS = 1024  # per block, on every CUDA GPU
SHARED_BYTES = 48 * 1024  # static shared memory per block, on every CUDA GPU (more takes a dynamic opt-in)
_STAGED: dict[tuple, int] = {}  # (template, workload, config) -> bytes staged in shared memory per block
STAGED_KEPT = 4096  # configs whose staged bytes are kept: a long study's validations never grow it further


def vector_width(extent: int) -> int:
    """The widest load that divides every shared tile: the reduction tile is a multiple of it."""
    return max(v for v in VECTOR_WIDTHS if extent % v == 0)


@dataclass(frozen=True)
class GpuTiledTemplate(Template):
    name: str
    op: str  # the operator it schedules
    tiled: tuple[str, ...]
    reduce_tiled: tuple[str, ...]
    has_pad: bool = False

    def axes(self, workload: Workload) -> list[Axis]:
        """The anchor's loops under the names the knobs use (a catalogue op's own)."""
        return workload.axes

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any]:
        """The anchor block (its padding producer inlined) and its elementwise consumer (None where absent)."""
        if self.has_pad and workload.op.has_pad_stage(workload.params):
            sch.compute_inline(sch.get_sblock(PAD_STAGE))
        epilogue = epilogue_name(workload)
        return sch.get_sblock(workload.op.anchor), sch.get_sblock(epilogue) if epilogue else None

    def extents(self, workload: Workload) -> dict[str, int]:
        return {a.name: a.extent for a in self.axes(workload)}

    def knobs(self, workload: Workload) -> list[Knob]:
        ext = self.extents(workload)
        caps = THREAD_CAPS[len(self.tiled)]
        knobs = [Knob(f"{a}_split", split_choices(ext[a], (cap, REGISTER_TILE_CAP)),
                      f"loop {a} ({ext[a]}) as blocks x threads x register tile (threadIdx.x: the threads' product)")
                 for a, cap in zip(self.tiled, caps)]
        knobs += [Knob(f"{r}_inner", self._reduce_tiles(ext[r]), f"inner tile of reduction loop {r} (the shared-memory step)")
                  for r in self.reduce_tiled]
        vector = min(vector_width(ext[r]) for r in self.reduce_tiled)
        knobs += [
            Knob("shared", (0, 1), "stage input tiles in shared memory, fetched by all threads of the block"),
            Knob("vector", tuple(v for v in VECTOR_WIDTHS if v <= vector), "width of the vectorised loads of the shared-memory fetch"),
            Knob("unroll_max_step", UNROLL_STEPS, "pragma_auto_unroll_max_step on the thread's loop"),
        ]
        return knobs

    @staticmethod
    def _reduce_tiles(extent: int) -> tuple[int, ...]:
        """Divisors of the loop that are multiples of its vector width (every shared tile splits into loads)."""
        return tuple(d for d in divisors(extent, REDUCE_TILE_CAP) if d % vector_width(extent) == 0)

    def default_config(self, workload: Workload) -> Config:
        """16 x 8 threads with 4 x 4 register tiles where the loops allow, staged in shared memory; register
        tiles of 1 where those tiles overflow shared memory, and no staging where even those do."""
        config = self._widest_default(workload)
        if self.staged_bytes(config, workload) > SHARED_BYTES:
            for a in self.tiled:
                blocks, thread, inner = split_factors(config[f"{a}_split"])
                config[f"{a}_split"] = SPLIT_SEP.join(map(str, (blocks * inner, thread, 1)))
        if self.staged_bytes(config, workload) > SHARED_BYTES:
            config["shared"] = 0
        return config

    def _widest_default(self, workload: Workload) -> Config:
        ext = self.extents(workload)
        caps = THREAD_CAPS[len(self.tiled)]
        config: Config = {}
        for idx, (a, cap) in enumerate(zip(reversed(self.tiled), reversed(caps))):  # innermost: 16 threads, the next: 8
            thread = divisors(ext[a], min(cap, (16, 8)[idx] if idx < 2 else 1))[-1]
            inner = divisors(ext[a] // thread, 4 if idx < 2 else 1)[-1]
            config[f"{a}_split"] = SPLIT_SEP.join(map(str, (ext[a] // (thread * inner), thread, inner)))
        for r in self.reduce_tiled:
            config[f"{r}_inner"] = max(t for t in self._reduce_tiles(ext[r]) if t <= max(8, vector_width(ext[r])))
        config.update(shared=1, vector=1, unroll_max_step=64)
        return config

    def parameters(self, config: Config, workload: Workload) -> Config:
        params = {k: v for k, v in config.items() if not k.endswith("_split")}
        for a in self.tiled:
            _, params[f"{a}_thread"], params[f"{a}_inner"] = split_factors(config[f"{a}_split"])
        return params

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        vocab: dict[str, tuple | None] = {f"{a}_{level}": None for a in self.tiled for level in ("thread", "inner")}
        vocab.update({f"{r}_inner": None for r in self.reduce_tiled})
        vocab.update(shared=None, vector=None, unroll_max_step=None)
        return vocab

    def check(self, config: Config, workload: Workload) -> None:
        staged = self.staged_bytes(config, workload)
        if staged > SHARED_BYTES:
            raise ConfigError("shared", f"the tiles staged in shared memory take {staged / 1024:.1f} KB a block, more "
                                        f"than its {SHARED_BYTES // 1024} KB on {workload.name}")

    def staged_bytes(self, config: Config, workload: Workload) -> int:
        """The bytes a block stages in shared memory under ``config`` (0 without staging), read off its
        schedule (scheduled here once per config)."""
        if not config["shared"]:
            return 0
        key = (self.name, workload.name, tuple(sorted(config.items())))
        if key not in _STAGED:
            if len(_STAGED) >= STAGED_KEPT:
                _STAGED.clear()
            import tvm
            from tvm import s_tir

            _STAGED[key] = self._apply(s_tir.Schedule(tvm.IRModule({"main": workload.prim_func()})), config, workload)
        return _STAGED[key]

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        self._apply(sch, config, workload)

    def _apply(self, sch: Schedule, config: Config, workload: Workload) -> int:
        """Schedule ``sch``; the bytes staged in shared memory per block."""
        config = self.parameters(config, workload)
        block, epilogue = self.stages(sch, workload)
        write_back = sch.cache_write(block, 0, "local")
        if epilogue is not None:
            sch.reverse_compute_inline(epilogue)

        groups: dict[str, list] = {g: [] for g in ("block", "thread", "R0", "R1", "inner")}
        for axis, loop in zip(self.axes(workload), sch.get_loops(block)):
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
        staged = sum(self._stage_in_shared(sch, block, index, groups["R0"][-1], threads, config["vector"])
                     for index in range(len(sch.get(block).reads))) if config["shared"] else 0
        if config["unroll_max_step"]:
            sch.annotate(tx, "pragma_auto_unroll_max_step", config["unroll_max_step"])
            sch.annotate(tx, "pragma_unroll_explicit", 1)
        sch.decompose_reduction(block, groups["R0"][0])
        return staged

    @staticmethod
    def _stage_in_shared(sch: Schedule, block, index: int, at, threads: int, vector: int) -> int:
        """Copy read ``index`` of ``block`` into shared memory at loop ``at``, by all ``threads`` of the block;
        the bytes of the tile it stages."""
        import tvm

        stage = sch.cache_read(block, index, "shared")
        sch.compute_at(stage, at)
        loops = sch.get_loops(stage)
        depth = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(at))) + 1
        own = loops[depth:]
        staged = math.prod(int(sch.get(loop).extent) for loop in own) * \
            tvm.runtime.DataType(str(sch.get(stage).writes[0].source.dtype)).bits // 8
        fused = sch.fuse(*own) if own else sch.add_unit_loop(stage)  # a one-element tile has no loop left
        if vector > 1:  # the reduction tile is a multiple of ``vector``: the tile splits into whole loads
            fused, lanes = sch.split(fused, [None, vector])
            sch.vectorize(lanes)
        sch.bind(sch.split(fused, [None, threads])[1], "threadIdx.x")  # the last round may leave threads idle
        return staged


@dataclass(frozen=True)
class GpuFusedTemplate(GpuTiledTemplate):
    """A model's fused matmul or convolution: the anchor's loops take the catalogue op's names
    (``spatial_names`` the innermost spatial loops, batch loops before them ``b0, b1, ...``), its producers
    (reshapes, transposes, padding) are inlined into its reads and its epilogue (bias, batch norm,
    residual add, activation) into its write-back."""

    spatial_names: tuple[str, ...] = ()
    reduce_names: tuple[str, ...] = ()

    def axes(self, workload: Workload) -> list[Axis]:
        spatial = [a for a in workload.axes if not a.reduce]
        reduce = [a for a in workload.axes if a.reduce]
        names = [f"b{n}" for n in range(len(spatial) - len(self.spatial_names))] + [*self.spatial_names, *self.reduce_names]
        return [Axis(name, a.extent, a.reduce) for name, a in zip(names, [*spatial, *reduce])]

    def stages(self, sch: Schedule, workload: Workload) -> tuple[Any, Any]:
        return inline_around_anchor(sch)


GPU_TEMPLATES = (
    GpuTiledTemplate("cuda_matmul", "matmul", tiled=("i", "j"), reduce_tiled=("k",)),
    GpuTiledTemplate("cuda_batch_matmul", "batch_matmul", tiled=("i", "j"), reduce_tiled=("k",)),
    GpuTiledTemplate("cuda_dense", "dense", tiled=("i", "j"), reduce_tiled=("k",)),
    GpuTiledTemplate("cuda_conv2d", "conv2d", tiled=("f", "y", "x"), reduce_tiled=("rc",), has_pad=True),
    GpuFusedTemplate("cuda_fused_matmul", "fused_matmul", tiled=("i", "j"), reduce_tiled=("k",),
                     spatial_names=("i", "j"), reduce_names=("k",)),
    GpuFusedTemplate("cuda_fused_conv2d", "fused_conv2d", tiled=("f", "y", "x"), reduce_tiled=("rc",),
                     spatial_names=("n", "f", "y", "x"), reduce_names=("rc", "ry", "rx")),
)
