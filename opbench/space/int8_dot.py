"""int8 matrix products on the CPU's integer dot-product instruction: u8 activations x i8 weights summed into i32,
exactly, whatever the values (docs/workloads-and-templates.md#int8).

The weight ``W[k, n]`` is packed to ``(n / lanes, k / group, lanes, group)``: one vector register holds ``group``
consecutive ``k`` of ``lanes`` output columns, which the instruction multiplies by ``group`` activations broadcast to
every lane and sums into ``lanes`` i32 accumulators. The accumulators are a register tile of ``row_block`` rows by
``col_vectors`` vectors, written back (the bias added) once their reduction is done.

- **AVX-512 VNNI**: ``vpdpbusd``, 16 lanes x 4 (TVM's ``dot_16x4_vnni``, its accumulator a register).
- **AVX2 without VNNI**: ``vpmaddubsw`` would saturate on full-range u8 x i8 pairs, so the activations and weights
  are widened to i16 and ``vpmaddwd`` sums 2 products per i32 lane, 8 lanes x 2: exact for every input.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.exceptions import WorkloadError
from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Nest, Template, divisors
from opbench.space._schedule import IN_OP, LAYOUT_TRANSFORMS, WEIGHTS_PREPACKED, mark_prepack, pack_copy, vectorize_lanes
from opbench.workloads import Workload
from opbench.workloads._base import INT8
from opbench.workloads.fused import anchor_block, blocks_after

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

ROW_BLOCK_CAP = 8  # rows of the register tile
COLUMN_UNIT, STEP_UNIT = 16, 4  # every instruction's lanes divide the one, its group the other: the space is the same
# on every CPU (its records compare across devices), the instruction alone differs
COL_BLOCK_CAP = 64  # output columns of the register tile
K_CHUNK_CAP = 2048  # reduction steps of the inner chunk (the weight panel kept in cache)


@dataclass(frozen=True)
class DotInstruction:
    """One integer dot-product instruction as a TVM tensor intrinsic on a local accumulator."""

    name: str  # the tensor intrinsic's registered name
    isa: str  # the CPU flag (/proc/cpuinfo) that the instruction needs
    lanes: int  # i32 accumulators per instruction
    group: int  # products summed into each


VNNI = DotInstruction("opbench_dot_16x4_u8i8i32_vnni", "avx512_vnni", 16, 4)
AVX2 = DotInstruction("opbench_dot_8x2_u8i8i32_avx2", "avx2", 8, 2)
INSTRUCTIONS = (VNNI, AVX2)  # the first the CPU has is used


def instruction(isa: frozenset[str]) -> DotInstruction | None:
    """The integer dot product of a CPU with ``isa`` flags (None: none of :data:`INSTRUCTIONS`)."""
    return next((each for each in INSTRUCTIONS if each.isa in isa), None)


@functools.cache
def register(dot: DotInstruction) -> str:
    """Register ``dot``'s tensor intrinsic (once a process) and return its name."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    lanes, group = dot.lanes, dot.group

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (group,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (lanes, group), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, group):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    if dot is VNNI:
        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
            A = T.match_buffer(a, (group,), "uint8", offset_factor=1)
            B = T.match_buffer(b, (lanes, group), "int8", offset_factor=1)
            C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
                T.writes(C[0:lanes])
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), C.vload([0], "int32x16"),
                    T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), lanes),
                                  dtype="int8x64"),
                    B.vload([0, 0], "int8x64"), dtype="int32x16")  # (LLVM 20 and later: i8 vectors)
    else:
        @T.prim_func(s_tir=True)
        def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
            A = T.match_buffer(a, (group,), "uint8", offset_factor=1)
            B = T.match_buffer(b, (lanes, group), "int8", offset_factor=1)
            C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
                T.writes(C[0:lanes])
                pair = T.reinterpret(T.Cast("int16x2", A.vload([0], "uint8x2")), dtype="int32")
                C[T.ramp(T.int32(0), 1, lanes)] += T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                    T.reinterpret(T.broadcast(pair, lanes), dtype="int16x16"),
                    T.Cast("int16x16", B.vload([0, 0], "int8x16")), dtype="int32x8")

    TensorIntrin.register(dot.name, desc, impl, override=True)
    return dot.name


@dataclass(frozen=True)
class Int8DotTemplate(Template):
    """An int8 ``dense`` or ``matmul`` (weight ``[k, n]``) on the CPU's dot-product instruction."""

    name: str
    op: str  # dense or matmul

    def refusal(self, workload: Workload) -> str | None:
        """int8 only, ``n`` a multiple of :data:`COLUMN_UNIT` and ``k`` of :data:`STEP_UNIT`, on a CPU with an
        instruction of :data:`INSTRUCTIONS`."""
        if workload.dtype != INT8:
            return f"it schedules dtype=int8 only, not {workload.dtype}"
        _, n, k = (a.extent for a in workload.axes)
        if n % COLUMN_UNIT or k % STEP_UNIT:
            return f"it needs n a multiple of {COLUMN_UNIT} and k of {STEP_UNIT}, not n={n}, k={k}"
        if instruction(current_shape().isa) is None:
            return (f"the CPU has none of {', '.join(i.isa for i in INSTRUCTIONS)} "
                    "(the operator's own template takes int8 too)")
        return None

    def _sizes(self, workload: Workload) -> tuple[int, int, int, DotInstruction]:
        """(m, n, k, the instruction) of a workload the template schedules (WorkloadError otherwise)."""
        refusal = self.refusal(workload)
        if refusal:
            raise WorkloadError(f"template '{self.name}' does not apply to {workload.name}: {refusal}")
        m, n, k = (a.extent for a in workload.axes)
        return m, n, k, instruction(current_shape().isa)  # type: ignore[return-value]

    def knobs(self, workload: Workload) -> list[Knob]:
        m, n, k, _ = self._sizes(workload)
        return [
            Knob("row_block", divisors(m, ROW_BLOCK_CAP), f"rows of the register tile ({m} rows)"),
            Knob("col_block", _multiples(n, COLUMN_UNIT, COL_BLOCK_CAP),
                 f"output columns of the register tile ({n}), whole vectors of the instruction's lanes"),
            Knob("k_chunk", _multiples(k, STEP_UNIT, K_CHUNK_CAP),
                 f"reduction steps of the inner chunk ({k}): the weight panel kept in cache"),
            Knob("rows_outer", (0, 1), "1: the parallel loop runs over row blocks outside column blocks"),
            Knob("layout_transform", LAYOUT_TRANSFORMS, "where the weight is packed: in the operator, timed (in_op), "
                                                        "or once before (weights_prepacked, as a model's constant)"),
        ]

    def default_config(self, workload: Workload) -> Config:
        """A tile of 4 rows by 2 vectors where they divide the shape (AVX2's 16 registers leave room for 8
        accumulators), a weight panel of 256 reduction steps, packed in the operator."""
        m, n, k, dot = self._sizes(workload)
        return {"row_block": divisors(m, 4)[-1], "col_block": _multiples(n, COLUMN_UNIT, 2 * dot.lanes)[-1],
                "k_chunk": _multiples(k, STEP_UNIT, 256)[-1], "rows_outer": 0, "layout_transform": IN_OP}

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        return {"row_block": None, "col_block": None, "k_chunk": None, "rows_outer": None,
                "layout_transform": LAYOUT_TRANSFORMS}

    def nest(self, config: Config, workload: Workload) -> Nest:
        m, n, _, dot = self._sizes(workload)
        return Nest((config["row_block"], config["col_block"]), dot.lanes, config["k_chunk"],
                    m // config["row_block"] * n // config["col_block"])

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        *_, dot = self._sizes(workload)
        lanes, group = dot.lanes, dot.group
        rows, vectors = config["row_block"], config["col_block"] // dot.lanes
        product = anchor_block(sch)
        epilogue = blocks_after(sch, product)
        pack = sch.cache_read(product, 1, "global")
        sch.transform_layout(product, ("read", 1), lambda k, j: (j // lanes, k // group, j % lanes, k % group))
        pack_copy(sch, pack, {0: group, 1: lanes}, (2, 0, 3, 1), parallel=1)
        if config["layout_transform"] == WEIGHTS_PREPACKED:
            mark_prepack(sch, pack)
        write_back = sch.cache_write(product, 0, "local")  # the product now accumulates in registers
        for name in epilogue:  # the bias, added as the tile is written back
            sch.reverse_compute_inline(sch.get_sblock(name))
        i, j, k = sch.get_loops(product)
        io, ii = sch.split(i, [None, rows])
        jo, jv, jl = sch.split(j, [None, vectors, lanes])
        ko, kc, kg = sch.split(k, [None, config["k_chunk"] // group, group])
        outer = (io, jo) if config["rows_outer"] else (jo, io)
        sch.reorder(*outer, ko, kc, ii, jv, jl, kg)
        sch.reverse_compute_at(write_back, outer[1])
        sch.parallel(sch.fuse(*outer))
        init = sch.decompose_reduction(product, ko)
        vectorize_lanes(sch, sch.get_loops(init)[-1])
        sch.tensorize(jl, register(dot))
        sch.unroll(ii)
        sch.unroll(jv)
        vectorize_lanes(sch, sch.get_loops(write_back)[-1])


def _multiples(extent: int, unit: int, cap: int) -> tuple[int, ...]:
    """The multiples of ``unit`` that divide ``extent``, up to ``cap`` (``unit`` at least)."""
    return tuple(unit * d for d in divisors(extent // unit, max(cap // unit, 1)))


def peak_ops(dot: DotInstruction, threads: int, chains: int, iterations: int) -> float:
    """Operations (a multiply and an add per product) of one call of :func:`peak_kernel`."""
    return 2.0 * threads * chains * iterations * dot.lanes * dot.group


def peak_kernel(dot: DotInstruction, threads: int, chains: int, iterations: int) -> Any:
    """A PrimFunc whose every thread runs ``chains`` independent chains of ``dot``'s instruction on registers (each
    step's operand its own accumulator, so nothing is hoisted out of the loop): the host's int8 peak, as
    :func:`opbench.hardware.peak.peak_kernel` is its fp32 one. Its input seeds the accumulators, its output keeps
    them live."""
    from tvm.script import tirx as T

    lanes, shape = dot.lanes, (threads, chains, dot.lanes)
    vector, data = f"int32x{lanes}", f"int8x{lanes * 4}"

    def step(acc: Any, t: Any, c: Any) -> Any:
        now, other = acc.vload([t, c, 0], vector), acc.vload([t, (c + 1) % chains, 0], vector)
        if dot is VNNI:
            return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), now,
                                           T.reinterpret(now, dtype=data), T.reinterpret(other, dtype=data),
                                           dtype=vector)
        return now + T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                                             T.reinterpret(now, dtype="int16x16"), T.reinterpret(other, dtype="int16x16"),
                                             dtype=vector)

    @T.prim_func
    def main(seed: T.Buffer(shape, "int32"), out: T.Buffer(shape, "int32")) -> None:  # type: ignore[valid-type]
        acc = T.alloc_buffer(shape, "int32", scope="local")
        for t in T.parallel(threads):
            for c in T.unroll(chains):
                for lane in T.vectorized(lanes):
                    acc[t, c, lane] = seed[t, c, lane]
            for _ in range(iterations):
                for c in T.unroll(chains):
                    acc[t, c, T.ramp(0, 1, lanes)] = step(acc, t, c)
            for c in T.unroll(chains):
                for lane in T.vectorized(lanes):
                    out[t, c, lane] = acc[t, c, lane]

    return main
