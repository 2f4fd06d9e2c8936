"""A fused operator's epilogue (the elementwise blocks after its anchor: batch norm, bias, residual add,
ReLU, clip) rebuilt as a tensor-expression function, so that an algorithm that computes the anchor
differently (Winograd) can apply the same epilogue where it writes its output.

Each epilogue block of TOPI's lowering is one ``BufferStore`` over its spatial iteration variables; its
value is rebuilt node by node with the block's variables bound to the caller's indices and each buffer it
reads replaced by the anchor's value, an earlier epilogue block's value, or a parameter's tensor.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opbench.workloads.fused import REDUCE

Value = Callable[[Sequence[Any]], Any]  # indices -> PrimExpr

_BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "FloorDiv", "FloorMod", "EQ", "NE", "LT", "LE", "GT", "GE",
           "And", "Or")


class Unsupported(Exception):
    """A block or expression this rebuild does not handle (a reduction, a call, an opaque block)."""


def epilogue(func: Any, anchor_name: str, anchor: Value, params: list[tuple[Any, Value]]) -> Value:
    """``func``'s output as a function of its indices, given the anchor block's value (``anchor``) and each
    parameter buffer's it reads (``params``: pairs of ``func``'s buffer and its value)."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    names = [b.name_hint for b in blocks]
    values = [(blocks[names.index(anchor_name)].writes[0].source, anchor), *params]
    for block in blocks[names.index(anchor_name) + 1:]:
        values.append((block.writes[0].source, _block_value(block, values)))
    output = _lookup(values, list(func.params)[-1])
    if output is None:
        raise Unsupported("no block writes the output")
    return output


def _block_value(block: Any, values: list[tuple[Any, Value]]) -> Value:
    from tvm import tirx

    store = block.body
    if (not isinstance(store, tirx.BufferStore) or block.init is not None
            or any(int(iv.iter_type) == REDUCE for iv in block.iter_vars)):
        raise Unsupported(f"block {block.name_hint} is not elementwise")
    if not all(isinstance(i, tirx.Var) for i in store.indices):
        raise Unsupported(f"block {block.name_hint} writes a strided or shifted region")
    variables = list(store.indices)

    def value(indices: Sequence[Any]) -> Any:
        return _rebuild(store.value, list(zip(variables, indices)), values)

    return value


def _lookup(pairs: list[tuple[Any, Any]], key: Any) -> Any:
    return next((v for k, v in pairs if k.same_as(key)), None)


def _rebuild(expr: Any, bound: list[tuple[Any, Any]], values: list[tuple[Any, Value]]) -> Any:
    import tvm
    from tvm import tirx

    def again(e: Any) -> Any:
        return _rebuild(e, bound, values)

    if isinstance(expr, tvm.ir.TensorLoad):  # a buffer load (TVM 0.27)
        source = _lookup(values, expr.source)
        if source is None:
            raise Unsupported(f"reads {expr.source.name}, which is neither an input nor computed before")
        return source([again(i) for i in expr.indices])
    if isinstance(expr, tirx.Var):
        found = _lookup(bound, expr)
        if found is None:
            raise Unsupported(f"variable {expr.name} is not one of the block's")
        return found
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr
    if isinstance(expr, tirx.Cast):
        return tirx.Cast(expr.dtype, again(expr.value))
    if isinstance(expr, tirx.Select):
        return tirx.Select(again(expr.condition), again(expr.true_value), again(expr.false_value))
    if isinstance(expr, tirx.Not):
        return tirx.Not(again(expr.a))
    for name in _BINARY:
        if isinstance(expr, getattr(tirx, name)):
            return getattr(tirx, name)(again(expr.a), again(expr.b))
    raise Unsupported(f"expression {type(expr).__name__}")
