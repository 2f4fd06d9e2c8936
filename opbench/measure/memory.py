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
from opbench.workloads import Workload


def lowered(scheduled: Any, target: Any) -> Any:
    """``scheduled`` through the target's default TIR pipeline (the passes ``tvm.compile`` runs first)."""
    import tvm

    host = target if target.kind.name == "llvm" else tvm.target.Target("llvm")
    mod = tvm.tirx.transform.BindTarget(target.with_host(host))(scheduled)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    with tvm.transform.PassContext(opt_level=3):
        return pipeline(mod)


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
    import tvm

    dtype = tvm.runtime.DataType(buffer.dtype)
    return math.prod(int(d) for d in buffer.shape) * dtype.bits * dtype.lanes // 8


def io_bytes(workload: Workload) -> tuple[int, int]:
    """Bytes the kernel reads as inputs and writes as its output (its last parameter)."""

    sizes = [nbytes_of(b) for b in workload.prim_func().params]
    return sum(sizes[:-1]), sizes[-1]


def peaks(mod: Any) -> dict[str, int]:
    """Each storage scope's peak allocation over the module's functions (TVM's own analysis: buffers that
    are never alive together do not add up)."""
    from tvm import s_tir

    out: dict[str, int] = {}
    for per_scope in s_tir.analysis.calculate_allocated_bytes(mod).values():
        for scope, nbytes in per_scope.items():
            out[str(scope)] = max(out.get(str(scope), 0), int(nbytes))
    return out


def schedule_memory(scheduled: Any, target: Any, workload: Workload, threads: int) -> dict[str, float]:
    """The ``mem.*`` columns of a schedule of ``workload`` built for ``target`` with ``threads`` threads."""
    low = lowered(scheduled, target)
    allocs, by_scope = allocations(low), peaks(low)
    columns: dict[str, float] = {}
    total = 0.0
    for scope, peak in by_scope.items():
        key = MEM_PREFIX + scope.replace(".dyn", "").replace(".", "_")
        columns[key] = columns.get(key, 0.0) + peak
        in_parallel = sum(nbytes for s, nbytes, parallel in allocs if s == scope and parallel)
        total += peak + min(peak, in_parallel) * (max(threads, 1) - 1)  # a thread's buffers, once per thread
    inputs, output = io_bytes(workload)
    return {f"{MEM_PREFIX}input": float(inputs), f"{MEM_PREFIX}output": float(output), **columns,
            WORKSPACE_METRIC: float(sum(by_scope.values())), f"{WORKSPACE_METRIC}_total": total}
