"""int8 and bf16 matrix products on AMX tiles (docs/workloads-and-templates.md#amx): Intel's matrix unit, what
oneDNN (PyTorch's and OpenVINO's CPU kernels) runs these dtypes on where the CPU has it.

A tile register holds 16 rows of 64 bytes. ``tdpbusd`` (int8: u8 x i8 into i32) and ``tdpbf16ps`` (bf16 into fp32)
multiply a tile of activations (16 rows x 64 bytes of the reduction) by a tile of the weight packed as the dot-product
templates pack it, ``(n / 16, k / group, 16, group)``, and add into a 16 x 16 tile of accumulators. A register block
of ``rows`` x ``cols`` accumulator tiles (8 tile registers: at most 2 x 2, with their operands) is one call of a
kernel written in LLVM IR (:func:`kernel_ir`): the accumulators loaded, ``k_chunk`` of the reduction summed into them
in tiles, stored back. TVM 0.27 has no AMX intrinsic, and its LLVM code generator no tile type, so the kernel is
linked in through ``pragma_import_llvm`` and called per block (a tensor intrinsic over the whole block); LLVM
configures the tiles (``ldtilecfg``) itself. Linux hands a process the tiles' state only once asked
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): the kernel asks on its first call.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.hardware.cpu_shape import current_shape
from opbench.space._base import Config, Knob, Nest, Template
from opbench.space._schedule import LAYOUT_TRANSFORMS, default_layout_transform, vectorize_lanes
from opbench.space.dot_product import (
    LLVM_IMPORT,
    ORDER_AND_LAYOUT_KNOBS,
    multiples,
    operand_address,
    packed_product,
    product_refusal,
)
from opbench.workloads import Workload
from opbench.workloads._base import ACCUMULATOR, BF16, INT8, OPERANDS

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

AMX_FLAG = "amx_tile"  # /proc/cpuinfo's flag (every CPU with tiles has their int8 and bf16 products)
TILE_ROWS, TILE_BYTES = 16, 64
TILE = f"i16 {TILE_ROWS}, i16 {TILE_BYTES}"  # a full tile's shape as the LLVM intrinsics take it
GROUP = {INT8: 4, BF16: 2}  # reduction steps in one 32-bit element of a weight tile's row
PRODUCT = {INT8: "tdpbusd", BF16: "tdpbf16ps"}
ELEMENT_BYTES = {INT8: 1, BF16: 2}
K_CHUNK_CAP = 1024  # reduction steps of a kernel call (its code is unrolled over them)
DEFAULT_CHUNK_BYTES = 384  # a default call's reduction, in bytes of an operand row: a 2 x 2 block's operands, 24 KB,
# in half a 48 KB L1 (on Sapphire Rapids, BERT-base's products ran 2-7% faster than with 256 steps a call)
BLOCKS = ("1x1", "1x2", "2x1", "2x2")  # accumulator tiles, rows x columns
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158


def k_step(dtype: str) -> int:
    """Reduction steps of one tile product: a tile row's 64 bytes of activations."""
    return TILE_BYTES // ELEMENT_BYTES[dtype]


def kernel_name(dtype: str, rows: int, cols: int, k_chunk: int) -> str:
    return f"opbench_amx_{PRODUCT[dtype]}_{rows}x{cols}_k{k_chunk}"


def kernel_ir(dtype: str, rows: int, cols: int, k_chunk: int) -> str:
    """LLVM IR of ``kernel_name(...)(c, ldc, a, lda, b, ldb)``: the ``rows`` x ``cols`` accumulator tiles at ``c``
    (rows ``ldc`` bytes apart) plus the activations at ``a`` (rows ``lda`` bytes apart) times the packed weight at
    ``b`` (column tiles ``ldb`` bytes apart), over ``k_chunk`` reduction steps."""
    name, product = kernel_name(dtype, rows, cols, k_chunk), PRODUCT[dtype]
    body, acc = [], {}
    for i in range(rows):
        body += [f"  %arow{i} = mul i64 %lda, {i * TILE_ROWS}", f"  %a{i} = getelementptr i8, ptr %a, i64 %arow{i}",
                 f"  %crow{i} = mul i64 %ldc, {i * TILE_ROWS}", f"  %crows{i} = getelementptr i8, ptr %c, i64 %crow{i}"]
        for j in range(cols):
            body += [f"  %c{i}{j} = getelementptr i8, ptr %crows{i}, i64 {j * TILE_BYTES}",
                     f"  %acc{i}{j}_0 = call x86_amx @llvm.x86.tileloadd64.internal({TILE}, ptr %c{i}{j}, i64 %ldc)"]
            acc[i, j] = f"%acc{i}{j}_0"
    for j in range(cols):
        body += [f"  %bcol{j} = mul i64 %ldb, {j}", f"  %b{j} = getelementptr i8, ptr %b, i64 %bcol{j}"]
    for s in range(k_chunk // k_step(dtype)):
        for i in range(rows):
            body += [f"  %ap{i}_{s} = getelementptr i8, ptr %a{i}, i64 {s * TILE_BYTES}",
                     f"  %at{i}_{s} = call x86_amx @llvm.x86.tileloadd64.internal({TILE}, ptr %ap{i}_{s}, i64 %lda)"]
        for j in range(cols):
            body += [f"  %bp{j}_{s} = getelementptr i8, ptr %b{j}, i64 {s * TILE_ROWS * TILE_BYTES}",
                     f"  %bt{j}_{s} = call x86_amx @llvm.x86.tileloadd64.internal({TILE}, ptr %bp{j}_{s}, "
                     f"i64 {TILE_BYTES})"]
        for i in range(rows):
            for j in range(cols):
                body.append(f"  %acc{i}{j}_{s + 1} = call x86_amx @llvm.x86.{product}.internal({TILE}, "
                            f"i16 {TILE_BYTES}, x86_amx {acc[i, j]}, x86_amx %at{i}_{s}, x86_amx %bt{j}_{s})")
                acc[i, j] = f"%acc{i}{j}_{s + 1}"
    body += [f"  call void @llvm.x86.tilestored64.internal({TILE}, ptr %c{i}{j}, i64 %ldc, x86_amx {acc[i, j]})"
             for i in range(rows) for j in range(cols)]
    return _function(name, product, "ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb", body)


def peak_ir(dtype: str, rounds: int) -> str:
    """LLVM IR of ``peak_name(dtype)(c, a, b)``: 2 x 2 accumulator tiles at ``c`` (rows 128 bytes apart) plus
    ``rounds`` times the product of the two activation tiles at ``a`` and the two weight tiles at ``b`` (each 1 KB),
    every tile in its register throughout (all 8)."""
    body = [f"  %{operand}{t} = call x86_amx @llvm.x86.tileloadd64.internal({TILE}, ptr %{operand}p{t}, i64 "
            f"{TILE_BYTES})" for operand in "ab" for t in range(2)]
    body = [f"  %{operand}p{t} = getelementptr i8, ptr %{operand}, i64 {t * TILE_ROWS * TILE_BYTES}"
            for operand in "ab" for t in range(2)] + body
    for i in range(2):
        for j in range(2):
            body += [f"  %cp{i}{j} = getelementptr i8, ptr %c, i64 {i * TILE_ROWS * 2 * TILE_BYTES + j * TILE_BYTES}",
                     f"  %c{i}{j}_0 = call x86_amx @llvm.x86.tileloadd64.internal({TILE}, ptr %cp{i}{j}, i64 128)"]
    for r in range(rounds):
        body += [f"  %c{i}{j}_{r + 1} = call x86_amx @llvm.x86.{PRODUCT[dtype]}.internal({TILE}, i16 {TILE_BYTES}, "
                 f"x86_amx %c{i}{j}_{r}, x86_amx %a{i}, x86_amx %b{j})" for i in range(2) for j in range(2)]
    body += [f"  call void @llvm.x86.tilestored64.internal({TILE}, ptr %cp{i}{j}, i64 128, x86_amx %c{i}{j}_{rounds})"
             for i in range(2) for j in range(2)]
    return _function(peak_name(dtype), PRODUCT[dtype], "ptr %c, ptr %a, ptr %b", body)


def peak_name(dtype: str) -> str:
    return f"opbench_amx_{PRODUCT[dtype]}_peak"


def _function(name: str, product: str, parameters: str, body: list[str]) -> str:
    """An internal function ``name(parameters)`` running ``body`` once the process may use the tiles (asked of
    Linux on its first call), with the declarations it needs."""
    ask = f"i64 {SYS_ARCH_PRCTL}, i64 {ARCH_REQ_XCOMP_PERM}, i64 {XFEATURE_XTILEDATA}"
    return "\n".join([
        f"@{name}_ready = internal global i1 false",
        f"define internal void @{name}({parameters}) {{",
        f"  %ready = load i1, ptr @{name}_ready", "  br i1 %ready, label %go, label %ask", "ask:",
        f"  call i64 (i64, ...) @syscall({ask})", f"  store i1 true, ptr @{name}_ready", "  br label %go", "go:",
        *body, "  ret void", "}", "declare i64 @syscall(i64, ...)",
        "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
        f"declare x86_amx @llvm.x86.{product}.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
        "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)", ""])


@functools.cache
def register(dtype: str, rows: int, cols: int, k_chunk: int) -> str:
    """Register the tensor intrinsic of one kernel call (``rows`` x ``cols`` tiles, ``k_chunk`` steps) once a
    process, and return its name."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    activation, weight, _ = OPERANDS[dtype]
    acc, group, name = ACCUMULATOR[dtype], GROUP[dtype], kernel_name(dtype, rows, cols, k_chunk)
    m, n, size = rows * TILE_ROWS, cols * TILE_ROWS, ELEMENT_BYTES[dtype]
    ir = kernel_ir(dtype, rows, cols, k_chunk)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (m, k_chunk), activation, offset_factor=1, strides=[T.int32(), 1])
        B = T.match_buffer(b, (cols, k_chunk // group, TILE_ROWS, group), weight, offset_factor=1,
                           strides=[T.int32(), TILE_ROWS * group, group, 1])
        C = T.match_buffer(c, (m, n), acc, offset_factor=1, strides=[T.int32(), 1], scope="local")
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:m, 0:k_chunk], B[0:cols, 0:k_chunk // group, 0:TILE_ROWS, 0:group])
            T.writes(C[0:m, 0:n])
            for i, j, k in T.grid(m, n, k_chunk):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], acc) * T.cast(
                        B[vj // TILE_ROWS, vk // group, vj % TILE_ROWS, vk % group], acc)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda, ldb, ldc = T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (m, k_chunk), activation, offset_factor=1, strides=[lda, 1])
        B = T.match_buffer(b, (cols, k_chunk // group, TILE_ROWS, group), weight, offset_factor=1,
                           strides=[ldb, TILE_ROWS * group, group, 1])
        C = T.match_buffer(c, (m, n), acc, offset_factor=1, strides=[ldc, 1], scope="local")
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:m, 0:k_chunk], B[0:cols, 0:k_chunk // group, 0:TILE_ROWS, 0:group])
            T.writes(C[0:m, 0:n])
            with T.attr(0, LLVM_IMPORT, ir):
                T.evaluate(T.call_extern(
                    "void", name, operand_address(C, acc, m * ldc, 3), T.cast(ldc, "int64") * 4,
                    operand_address(A, activation, m * lda), T.cast(lda, "int64") * size,
                    operand_address(B, weight, cols * ldb), T.cast(ldb, "int64") * size))

    TensorIntrin.register(name, desc, impl, override=True)
    return name


@dataclass(frozen=True)
class AmxTemplate(Template):
    """A ``dense`` or ``matmul`` (weight ``[k, n]``) of ``dtype`` on AMX tiles, a register block of tiles a call."""

    name: str
    op: str  # dense or matmul
    dtype: str  # int8 or bfloat16

    def refusal(self, workload: Workload) -> str | None:
        """Its dtype only, a 2-D product of whole tiles (``m`` and ``n`` multiples of 16, ``k`` of a tile row's
        reduction steps), on a CPU with AMX."""
        refused = product_refusal(self.dtype, workload)
        if refused:
            return refused
        m, n, k = (a.extent for a in workload.axes)
        if m % TILE_ROWS or n % TILE_ROWS or k % k_step(self.dtype):
            return (f"it needs m and n multiples of {TILE_ROWS} and k of {k_step(self.dtype)}, "
                    f"not m={m}, n={n}, k={k}")
        if AMX_FLAG not in current_shape().isa:
            return f"the CPU has no AMX tiles ({AMX_FLAG}; the dot-product template takes {self.dtype} too)"
        return None

    def _sizes(self, workload: Workload) -> tuple[int, int, int]:
        self.check_applies(workload)
        m, n, k = (a.extent for a in workload.axes)
        return m, n, k

    def knobs(self, workload: Workload) -> list[Knob]:
        m, n, k = self._sizes(workload)
        blocks = tuple(b for b in BLOCKS if not m // TILE_ROWS % int(b[0]) and not n // TILE_ROWS % int(b[2]))
        return [
            Knob("block", blocks, f"accumulator tiles of a call, rows x columns ({m // TILE_ROWS} x "
                                  f"{n // TILE_ROWS} tiles of 16 x 16)"),
            Knob("k_chunk", multiples(k, k_step(self.dtype), K_CHUNK_CAP),
                 f"reduction steps of a call ({k}), whole tile rows: the weight panel kept in cache"),
            *ORDER_AND_LAYOUT_KNOBS,
        ]

    def default_config(self, workload: Workload) -> Config:
        """2 x 2 tiles where they divide the shape (all 8 tile registers), :data:`DEFAULT_CHUNK_BYTES` of reduction a
        call."""
        m, n, k = self._sizes(workload)
        blocks, chunk = self.knobs(workload)[0].choices, DEFAULT_CHUNK_BYTES // ELEMENT_BYTES[self.dtype]
        return {"block": blocks[-1], "k_chunk": multiples(k, k_step(self.dtype), chunk)[-1], "rows_outer": 0,
                "layout_transform": default_layout_transform(self.op)}

    def parameter_vocabulary(self) -> dict[str, tuple | None]:
        return {"block": BLOCKS, "k_chunk": None, "rows_outer": None, "layout_transform": LAYOUT_TRANSFORMS}

    def nest(self, config: Config, workload: Workload) -> Nest:
        m, n, _ = self._sizes(workload)
        rows, cols = (int(x) * TILE_ROWS for x in config["block"].split("x"))
        return Nest((rows, cols), TILE_ROWS, config["k_chunk"], m // rows * n // cols)

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        self._sizes(workload)
        rows, cols = (int(x) for x in config["block"].split("x"))
        product, write_back = packed_product(sch, config, TILE_ROWS, GROUP[self.dtype])
        i, j, k = sch.get_loops(product)
        io, ii = sch.split(i, [None, rows * TILE_ROWS])
        jo, ji = sch.split(j, [None, cols * TILE_ROWS])
        ko, ki = sch.split(k, [None, config["k_chunk"]])
        outer = (io, jo) if config["rows_outer"] else (jo, io)
        sch.reorder(*outer, ko, ii, ji, ki)
        sch.reverse_compute_at(write_back, outer[1])
        sch.parallel(sch.fuse(*outer))
        init = sch.decompose_reduction(product, ko)
        vectorize_lanes(sch, sch.get_loops(init)[-1])
        sch.tensorize(ii, register(self.dtype, rows, cols, config["k_chunk"]))
        vectorize_lanes(sch, sch.get_loops(write_back)[-1])


PEAK_ROUNDS = 64  # rounds of a peak call's four tile products, every tile in its register
PEAK_CALLS = 400  # calls a thread of the peak kernel makes
PEAK_WORDS = 1024  # 32-bit words of each of a thread's two buffers: 2 x 2 accumulator tiles; the operands' 4 tiles


def peak_kernel(dtype: str, threads: int) -> Any:
    """The host's AMX peak for ``dtype`` as :mod:`opbench.hardware.peak` measures fp32's: each thread calls
    :func:`peak_ir`'s kernel :data:`PEAK_CALLS` times on tiles of its own rows of the buffers."""
    from tvm.script import tirx as T

    ir, name = peak_ir(dtype, PEAK_ROUNDS), peak_name(dtype)

    @T.prim_func
    def main(seed: T.Buffer((threads, PEAK_WORDS), "int32"), out: T.Buffer((threads, PEAK_WORDS), "int32")) -> None:  # type: ignore[valid-type]
        for t in T.parallel(threads):
            with T.attr(0, LLVM_IMPORT, ir):
                for _ in range(PEAK_CALLS):
                    T.evaluate(T.call_extern("void", name, T.address_of(out[t, 0]), T.address_of(seed[t, 0]),
                                             T.address_of(seed[t, PEAK_WORDS // 2])))

    return main


def peak_work(dtype: str, threads: int) -> float:
    """Operations (a multiply and an add per product) of one call of :func:`peak_kernel`."""
    return 2.0 * threads * PEAK_CALLS * PEAK_ROUNDS * 4 * TILE_ROWS * TILE_ROWS * k_step(dtype)
