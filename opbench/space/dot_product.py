"""int8 matrix products on the CPU's dot-product instructions (docs/workloads-and-templates.md#int8): u8 activations
x i8 weights summed into i32, exactly, whatever the values.

The weight ``W[k, n]`` is packed to ``(n / lanes, k / group, lanes, group)``: one vector register holds ``group``
consecutive ``k`` of ``lanes`` output columns, which the instruction multiplies by ``group`` activations broadcast to
every lane and sums into ``lanes`` accumulators. The accumulators are a register tile of ``row_block`` rows by
``col_block`` columns, written back (the bias added) once their reduction is done.

- **AVX-512 VNNI** (int8): ``vpdpbusd``, 16 lanes x 4 (as TVM's ``dot_16x4_vnni``, its accumulator a register).
- **AVX2** (int8, no VNNI): ``vpmaddubsw`` would saturate on full-range u8 x i8 pairs, so the operands are widened
  to i16 and ``vpmaddwd`` sums 2 products per i32 lane, 8 lanes x 2: exact for every input.
- **AVX512-BF16** (bf16): ``vdpbf16ps``, 16 fp32 lanes x 2 bf16 products. TVM 0.27 computes every bf16 value in fp32
  (``BF16ComputeLegalize`` always runs on CPUs) and has no LLVM ``bfloat`` vector, which the instruction's intrinsic
  takes, so the operands travel as their bits in i32 vectors to a small LLVM function (:data:`DPBF16PS_IR`, linked
  into the kernel through ``pragma_import_llvm`` and inlined) that casts them and calls it.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.hardware.peak import peak_kernel as generic_peak_kernel
from opbench.space._base import Config, Knob, Nest, Template, divisors
from opbench.space._schedule import (
    LAYOUT_TRANSFORMS,
    WEIGHTS_PREPACKED,
    default_layout_transform,
    inline_around_anchor,
    mark_prepack,
    pack_copy,
    vectorize_lanes,
)
from opbench.workloads import Workload
from opbench.workloads._base import ACCUMULATOR, BF16, INT8, INT8_STEP, OPERANDS
from opbench.workloads.fused import Fused

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

ROW_BLOCK_CAP = 8  # rows of the register tile
COLUMN_UNIT, STEP_UNIT = 16, INT8_STEP  # every instruction's lanes divide the one, its group the other: the space is the same
# on every CPU (its records compare across devices), the instruction alone differs
COL_BLOCK_CAP = 64  # output columns of the register tile
K_CHUNK_CAP = 2048  # reduction steps of the inner chunk (the weight panel kept in cache)


@dataclass(frozen=True)
class DotInstruction:
    """One dot-product instruction: ``lanes`` accumulators, each summing ``group`` products of a ``dtype`` workload's
    operands, as a TVM tensor intrinsic on a local accumulator; ``step`` is its LLVM call (accumulator vector,
    the activations' ``group`` values broadcast as one i32, the weight's vector)."""

    name: str  # the tensor intrinsic's registered name
    isa: str  # the CPU flag (/proc/cpuinfo) that the instruction needs
    dtype: str  # the workloads it computes
    lanes: int
    group: int
    step: Callable[[Any, Any, Any], Any]
    llvm_import: str = ""  # LLVM IR the step calls into, linked into every kernel that uses it
    step_at: Callable[[Any, Any, Any], Any] | None = None  # the step on its operands' addresses, where their stored
    # bits cannot be loaded as vectors of their type

    @property
    def accumulator(self) -> str:
        return f"{ACCUMULATOR[self.dtype]}x{self.lanes}"


def _call(intrinsic: str, dtype: str, *args: Any) -> Any:
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(dtype, intrinsic, *args)


def _vnni(acc: Any, pair: Any, weight: Any) -> Any:
    from tvm import tirx

    return _call("llvm.x86.avx512.vpdpbusd.512", "int32x16", acc, tirx.reinterpret("int8x64", tirx.Broadcast(pair, 16)),
                 tirx.reinterpret("int8x64", weight))  # (LLVM 20 and later take i8 vectors)


def _avx2(acc: Any, pair: Any, weight: Any) -> Any:
    from tvm import tirx

    return acc + _call("llvm.x86.avx2.pmadd.wd", "int32x8", tirx.reinterpret("int16x16", tirx.Broadcast(pair, 8)),
                       tirx.reinterpret("int16x16", weight))


LLVM_IMPORT = "pragma_import_llvm"  # a statement attribute: TVM's LLVM code generator links the IR it holds
DPBF16PS = "opbench_dpbf16ps"  # (accumulators, the activations' pair, the weight vector; or the addresses of both)
DPBF16PS_IR = f"""
define internal <16 x float> @{DPBF16PS}(<16 x float> %acc, i32 %pair, <16 x i32> %weight) alwaysinline {{
  %one = insertelement <16 x i32> poison, i32 %pair, i64 0
  %pairs = shufflevector <16 x i32> %one, <16 x i32> poison, <16 x i32> zeroinitializer
  %a = bitcast <16 x i32> %pairs to <32 x bfloat>
  %b = bitcast <16 x i32> %weight to <32 x bfloat>
  %sum = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %a, <32 x bfloat> %b)
  ret <16 x float> %sum
}}
define internal <16 x float> @{DPBF16PS}_at(<16 x float> %acc, ptr %pair_at, ptr %weight_at) alwaysinline {{
  %pair = load i32, ptr %pair_at, align 2
  %weight = load <16 x i32>, ptr %weight_at, align 2
  %sum = call <16 x float> @{DPBF16PS}(<16 x float> %acc, i32 %pair, <16 x i32> %weight)
  ret <16 x float> %sum
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


def _bf16(acc: Any, pair: Any, weight: Any) -> Any:
    from tvm import tirx

    return tirx.call_extern("float32x16", DPBF16PS, acc, pair, tirx.reinterpret("int32x16", weight))


def _bf16_at(acc: Any, pair: Any, weight: Any) -> Any:
    from tvm import tirx

    return tirx.call_extern("float32x16", f"{DPBF16PS}_at", acc, pair, weight)


VNNI = DotInstruction("opbench_dot_16x4_u8i8i32_vnni", "avx512_vnni", INT8, 16, 4, _vnni)
AVX2 = DotInstruction("opbench_dot_8x2_u8i8i32_avx2", "avx2", INT8, 8, 2, _avx2)
AVX512_BF16 = DotInstruction("opbench_dot_16x2_bf16f32_avx512bf16", "avx512_bf16", BF16, 16, 2, _bf16, DPBF16PS_IR,
                             _bf16_at)
INSTRUCTIONS = {INT8: (VNNI, AVX2), BF16: (AVX512_BF16,)}  # by dtype: the first the CPU has is used


def instruction(dtype: str, isa: frozenset[str]) -> DotInstruction | None:
    """The dot product of a CPU with ``isa`` flags for ``dtype`` (None: none of :data:`INSTRUCTIONS`)."""
    return next((each for each in INSTRUCTIONS.get(dtype, ()) if each.isa in isa), None)


def _operands(dot: DotInstruction, a: Any, b: Any) -> tuple[Any, Any]:
    """The activations' ``group`` values as one i32 (AVX2's widened to i16 pairs first) and the weight's vector
    (AVX2's widened to i16), from the intrinsic's buffers; their addresses for an instruction's ``step_at``."""
    from tvm import tirx

    if dot.step_at:
        return operand_address(a, dot.dtype, dot.group), operand_address(b, dot.dtype, dot.lanes * dot.group)
    activation, weight, _ = OPERANDS[dot.dtype]
    values = a.vload([0], f"{activation}x{dot.group}")
    row = b.vload([0, 0], f"{weight}x{dot.lanes * dot.group}")
    if dot is AVX2:
        return tirx.reinterpret("int32", tirx.Cast("int16x2", values)), tirx.Cast("int16x16", row)
    return tirx.reinterpret("int32", values), row


def operand_address(buffer: Any, dtype: str, extent: Any, access: int = 1) -> Any:
    """The address of ``buffer``'s first ``extent`` elements for an ``access`` (1 read, 2 write, 3 both), bf16 typed as
    the 16-bit words it is stored in (a bf16 type would be legalised to fp32, as would an intermediate bf16 buffer)."""
    from tvm import tirx

    stored = "uint16" if dtype == BF16 else dtype
    return tirx.tvm_access_ptr(tirx.type_annotation(stored), buffer.data, buffer.elem_offset, extent, access)


@functools.cache
def register(dot: DotInstruction, name: str = "", scope: str = "local") -> str:
    """Register ``dot``'s tensor intrinsic on an accumulator in ``scope`` under ``name`` (its own by default), once a
    process, and return the name."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    lanes, group, (activation, weight, _), acc = dot.lanes, dot.group, OPERANDS[dot.dtype], ACCUMULATOR[dot.dtype]
    linked, step = bool(dot.llvm_import), dot.step_at or dot.step

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (group,), activation, offset_factor=1)
        B = T.match_buffer(b, (lanes, group), weight, offset_factor=1)
        C = T.match_buffer(c, (lanes,), acc, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, group):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], acc) * T.cast(B[vi, vk], acc)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (group,), activation, offset_factor=1)
        B = T.match_buffer(b, (lanes, group), weight, offset_factor=1)
        C = T.match_buffer(c, (lanes,), acc, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            if linked:
                with T.attr(0, LLVM_IMPORT, dot.llvm_import):
                    C[T.ramp(T.int32(0), 1, lanes)] = step(C.vload([0], dot.accumulator), *_operands(dot, A, B))
            else:
                C[T.ramp(T.int32(0), 1, lanes)] = step(C.vload([0], dot.accumulator), *_operands(dot, A, B))

    TensorIntrin.register(name or dot.name, desc, impl, override=True)
    return name or dot.name


def repair_tvm_vnni() -> None:
    """TVM 0.27's own ``dot_16x4_vnni`` (what MetaSchedule's x86 rules tensorize int8 with on a VNNI target) passes
    ``vpdpbusd`` i32 vectors where its LLVM takes i8 ones, so every candidate using it failed LLVM's verifier:
    registered again under its name with :data:`VNNI`'s step."""
    from tvm.s_tir.tensor_intrin.x86 import VNNI_DOT_16x4_INTRIN

    register(VNNI, VNNI_DOT_16x4_INTRIN, "global")


@dataclass(frozen=True)
class DotProductTemplate(Template):
    """A ``dense`` or ``matmul`` (weight ``[k, n]``) of ``dtype`` on the CPU's dot-product instruction for it."""

    name: str
    op: str  # dense or matmul
    dtype: str  # a dtype of INSTRUCTIONS

    def refusal(self, workload: Workload) -> str | None:
        """Its dtype only (a model's matmul: its operands'), ``n`` a multiple of :data:`COLUMN_UNIT` and ``k`` of
        :data:`STEP_UNIT`, on a CPU with an instruction of :data:`INSTRUCTIONS` for the dtype."""
        refused = product_refusal(self.dtype, workload)
        if refused:
            return refused
        _, n, k = (a.extent for a in workload.axes)
        if n % COLUMN_UNIT or k % STEP_UNIT:
            return f"it needs n a multiple of {COLUMN_UNIT} and k of {STEP_UNIT}, not n={n}, k={k}"
        if instruction(self.dtype, current_shape().isa) is None:
            return (f"the CPU has none of {', '.join(i.isa for i in INSTRUCTIONS[self.dtype])} "
                    f"(the operator's own template takes {self.dtype} too)")
        return None

    def _sizes(self, workload: Workload) -> tuple[int, int, int, DotInstruction]:
        """(m, n, k, the instruction) of a workload the template schedules (WorkloadError otherwise)."""
        self.check_applies(workload)
        m, n, k = (a.extent for a in workload.axes)
        return m, n, k, instruction(self.dtype, current_shape().isa)  # type: ignore[return-value]

    def knobs(self, workload: Workload) -> list[Knob]:
        m, n, k, _ = self._sizes(workload)
        return [
            Knob("row_block", divisors(m, ROW_BLOCK_CAP), f"rows of the register tile ({m} rows)"),
            Knob("col_block", multiples(n, COLUMN_UNIT, COL_BLOCK_CAP),
                 f"output columns of the register tile ({n}), whole vectors of the instruction's lanes"),
            Knob("k_chunk", multiples(k, STEP_UNIT, K_CHUNK_CAP),
                 f"reduction steps of the inner chunk ({k}): the weight panel kept in cache"),
            *ORDER_AND_LAYOUT_KNOBS,
        ]

    def default_config(self, workload: Workload) -> Config:
        """A tile of 4 rows by 2 vectors where they divide the shape (AVX2's 16 registers leave room for 8
        accumulators), a weight panel of 256 reduction steps, packed in the operator (a model's constant weight:
        once, before)."""
        m, n, k, dot = self._sizes(workload)
        return {"row_block": divisors(m, 4)[-1], "col_block": multiples(n, COLUMN_UNIT, 2 * dot.lanes)[-1],
                "k_chunk": multiples(k, STEP_UNIT, 256)[-1], "rows_outer": 0,
                "layout_transform": default_layout_transform(self.op)}

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
        product, write_back = packed_product(sch, config, lanes, group)
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


ORDER_AND_LAYOUT_KNOBS = (
    Knob("rows_outer", (0, 1), "1: the parallel loop runs over row blocks outside column blocks"),
    Knob("layout_transform", LAYOUT_TRANSFORMS, "where the weight is packed: in the operator, timed (in_op), "
                                                "or once before (weights_prepacked, as a model's constant)"),
)


def product_refusal(dtype: str, workload: Workload) -> str | None:
    """Why a template of ``dtype`` matrix products refuses ``workload`` for its dtype or its loops (None: it does
    not)."""
    operands = operands_dtype(workload)
    if operands != dtype:
        return f"it schedules dtype={dtype} only, not {operands}"
    if len(workload.axes) != 3:
        return f"it schedules a 2-D product, not one of {len(workload.axes) - 1} loops"
    return None


def packed_product(sch: Schedule, config: Config, lanes: int, group: int) -> tuple[Any, Any]:
    """A matrix product's weight ``W[k, n]`` packed to ``(n / lanes, k / group, lanes, group)`` (once before, as a
    model's constant, where ``config`` prepacks it) and its output accumulated in a local block written back through
    the epilogue (the bias; a model's scaling back to fp32 too): (the product's block, the write-back block)."""
    product, epilogue = inline_around_anchor(sch)
    pack = sch.cache_read(product, 1, "global")
    sch.transform_layout(product, ("read", 1), lambda k, j: (j // lanes, k // group, j % lanes, k % group))
    pack_copy(sch, pack, {0: group, 1: lanes}, (2, 0, 3, 1), parallel=1)
    if config["layout_transform"] == WEIGHTS_PREPACKED:
        mark_prepack(sch, pack)
    write_back = sch.cache_write(product, 0, "local")
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)
    return product, write_back


def operands_dtype(workload: Workload) -> str:
    """The workload's dtype as the catalogue names it; a model's operator's from what its anchor reads (uint8 and int8:
    a quantized matrix product, int8)."""
    if not isinstance(workload.op, Fused):
        return workload.dtype
    return INT8 if workload.op.anchor_operands(workload.params)[:2] == OPERANDS[INT8][:2] else workload.dtype


def multiples(extent: int, unit: int, cap: int) -> tuple[int, ...]:
    """The multiples of ``unit`` that divide ``extent``, up to ``cap`` (``unit`` at least)."""
    return tuple(unit * d for d in divisors(extent // unit, max(cap // unit, 1)))


def peak_kernel(dot: DotInstruction, threads: int) -> Any:
    """The host's peak kernel (:func:`opbench.hardware.peak.peak_kernel`) for ``dot``'s dtype: chains of the
    instruction in registers, each link's weight operand its own accumulator, so nothing is hoisted out of the loop,
    and its activations a constant (a load in the loop kept the accumulators in memory: a third of the peak)."""
    from tvm import tirx

    def step(acc: Any, seed: Any, t: Any, c: Any) -> Any:
        now = acc.vload([t, c, 0], dot.accumulator)
        return dot.step(now, tirx.const(0x01010101, "int32"), now)

    from tvm.ir import StringImm

    kernel = generic_peak_kernel(threads, dot.lanes, ACCUMULATOR[dot.dtype], step=step)
    if not dot.llvm_import:
        return kernel
    return kernel.with_body(tirx.AttrStmt(tirx.const(0, "int32"), LLVM_IMPORT, StringImm(dot.llvm_import), kernel.body))
