"""What a schedule needs in memory beside its time (the record's ``mem.*`` columns, docs/records.md).

Its input and output bytes, and the buffers the schedule allocates by storage scope, read where they still
exist: the scheduled module lowered by the target's default TIR pipeline, after blocks are lowered and
before a CPU's allocations become workspace calls (``tvm.compile`` keeps neither module). ``mem.<scope>``
is a scope's peak allocation and ``mem.workspace`` their sum, as one thread sees it; ``mem.workspace_total``
counts the buffers allocated inside a parallel loop once per thread.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from opbench.record import MEM_PREFIX, WORKSPACE_METRIC

PRELOWERED = "opbench-prelowered"  # a TIR pipeline that lowers nothing: for a module :func:`lowered` made


def lowered(scheduled: Any, target: Any) -> Any:
    """``scheduled`` through the TIR pipeline ``tvm.compile`` runs before code generation, in the
    current pass context, as ``tvm.compile`` runs them: :func:`compile_lowered` builds the same kernel from it."""
    import tvm

    host = target if target.kind.name == "llvm" else tvm.target.Target("llvm")
    mod = tvm.tirx.transform.BindTarget(target.with_host(host))(scheduled)
    pipeline, _, _ = tvm.tirx.get_tir_pipeline("default")  # tvm.compile's (tir_pipeline="default")
    return pipeline(mod)


def compile_lowered(low: Any, target: Any) -> Any:
    """``tvm.compile`` of a module :func:`lowered` made, without lowering it again (the same kernel: only the
    host and device finalisation and code generation are left)."""
    import inspect

    import tvm

    pipelines = inspect.getmodule(tvm.tirx.get_tir_pipeline).PIPELINE_MAP  # type: ignore[union-attr]
    if PRELOWERED not in pipelines:
        def pass_through() -> tuple[Any, Any, Any]:
            _, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("default")
            return tvm.transform.Sequential([]), finalize_host, finalize_device

        pipelines[PRELOWERED] = pass_through
    return tvm.compile(low, target, tir_pipeline=PRELOWERED)


def allocations(mod: Any) -> list[tuple[str, int, bool]]:
    """Every buffer the module's functions allocate: (storage scope, bytes, inside a parallel loop)."""
    return [alloc for func in mod.functions.values() if hasattr(func, "body") for alloc in _walk(func.body, False)]


def _walk(stmt: Any, parallel: bool) -> Iterator[tuple[str, int, bool]]:
    from tvm import tirx

    if isinstance(stmt, tirx.AllocBuffer):
        yield stmt.buffer.scope(), nbytes_of(stmt.buffer), parallel
    parallel = parallel or isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL
    for name in ("body", "seq", "then_case", "else_case"):
        child = getattr(stmt, name, None)
        for each in [child] if isinstance(child, tirx.Stmt) else (child or ()):
            yield from _walk(each, parallel)


def nbytes_of(buffer: Any) -> int:
    """A buffer's bytes: its elements times their size, every lane of a vector type (float32x16) counted."""
    return bytes_of(buffer.shape, buffer.dtype)


def bytes_of(shape: Any, dtype: Any) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype`` (every lane of a vector type counted)."""
    import tvm

    kind = tvm.runtime.DataType(dtype)
    return math.prod(int(d) for d in shape) * kind.bits * kind.lanes // 8


def io_bytes(func: Any, outputs: int = 1) -> tuple[int, int]:
    """Bytes a PrimFunc reads as inputs and writes as outputs (its last ``outputs`` parameters)."""
    sizes = [nbytes_of(b) for b in func.params]
    return sum(sizes[:-outputs]), sum(sizes[-outputs:])


def peaks(mod: Any) -> dict[str, int]:
    """Each storage scope's peak allocation over the module's functions (TVM's own analysis: buffers that
    are never alive together do not add up)."""
    from tvm import s_tir

    out: dict[str, int] = {}
    for per_scope in s_tir.analysis.calculate_allocated_bytes(mod).values():
        for scope, nbytes in per_scope.items():
            out[str(scope)] = max(out.get(str(scope), 0), int(nbytes))
    return out


def schedule_memory(scheduled: Any, target: Any, unscheduled: Any, threads: int, outputs: int = 1) -> dict[str, float]:
    """The ``mem.*`` columns of a schedule built for ``target`` with ``threads`` threads; ``unscheduled``
    is the PrimFunc it schedules (its parameters: the inputs, then ``outputs`` outputs)."""
    return lowered_memory(lowered(scheduled, target), unscheduled, threads, outputs)


def lowered_memory(low: Any, unscheduled: Any, threads: int, outputs: int = 1) -> dict[str, float]:
    """:func:`schedule_memory` of a schedule :func:`lowered` already (a module of its function alone)."""
    allocs, by_scope = allocations(low), peaks(low)
    columns: dict[str, float] = {}
    total = 0.0
    for scope, peak in by_scope.items():
        key = MEM_PREFIX + scope.replace(".dyn", "").replace(".", "_")
        columns[key] = columns.get(key, 0.0) + peak
        in_parallel = sum(nbytes for s, nbytes, parallel in allocs if s == scope and parallel)
        total += peak + min(peak, in_parallel) * (max(threads, 1) - 1)  # a thread's buffers, once per thread
    inputs, output = io_bytes(unscheduled, outputs)
    return {f"{MEM_PREFIX}input": float(inputs), f"{MEM_PREFIX}output": float(output), **columns,
            WORKSPACE_METRIC: float(sum(by_scope.values())), f"{WORKSPACE_METRIC}_total": total}


def planned_memory(mod: Any) -> dict[str, float]:
    """A fused Relax model's memory as planned: its weights (the constants bound into it) and its
    activations after Relax's static memory planning (the storage its functions allocate), in bytes."""
    import tvm
    from tvm import relax

    planning = tvm.transform.Sequential([
        relax.transform.RewriteDataflowReshape(), relax.transform.ToNonDataflow(), relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(), relax.transform.StaticPlanBlockMemory()])
    storage, tensor = tvm.ir.Op.get("relax.memory.alloc_storage"), tvm.ir.Op.get("relax.builtin.alloc_tensor")
    totals = {"weights": 0, "activations": 0}

    def visit(expr: Any) -> None:
        if isinstance(expr, tvm.ir.Constant) and hasattr(expr.value, "shape"):  # a tensor, not a scalar
            totals["weights"] += nbytes_of(expr.value)
        elif isinstance(expr, relax.Call) and expr.op.same_as(storage):
            totals["activations"] += int(expr.args[0].values[0])
        elif isinstance(expr, relax.Call) and expr.op.same_as(tensor):  # left unplanned: counted as it is
            totals["activations"] += bytes_of(expr.args[0].values, expr.args[1].value)

    for func in planning(mod).functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return {f"{MEM_PREFIX}{k}": float(v) for k, v in totals.items()}
