"""Winograd F(m x m, 3 x 3) for a model's fused 3x3 stride-1 convolution: the convolution's PrimFunc is
rebuilt as the Winograd stages of :mod:`opbench.space.winograd_stages`, its epilogue (batch norm, residual add,
ReLU; :mod:`opbench.space.epilogue`) applied where the inverse transform is written out, with the
same parameters as the fused PrimFunc. The weight's transform runs in the operator per output-channel block
(``winograd_in_op`` 1), or is one stage reading the weight alone, marked as a layout rewrite: a model computes
it once at build time on its constant weight, as it packs the direct algorithm's weight, and a
``weights_prepacked`` trial once before its timed calls.

The result is a new PrimFunc, not a schedule of the fused one. A model's tuning record (a schedule's trace)
therefore only marks the fused PrimFunc with the config (:func:`mark`), and the model swaps the marked
PrimFuncs for their rebuilds once the records are applied (:func:`rebuild_marked`).
"""
from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from opbench.space._base import Config
from opbench.space.epilogue import Unsupported, epilogue
from opbench.space.winograd_stages import TILES, ConvShape, schedule, stages
from opbench.workloads import Workload
from opbench.workloads.fused import anchor_block

if TYPE_CHECKING:
    from tvm import IRModule


@functools.lru_cache(maxsize=64)  # read by every knob, default and nest of the workload
def _shape(func: Any) -> tuple[ConvShape, str, Any, Any]:
    """The convolution's sizes, the anchor block's name and the data and weight buffers of a fused PrimFunc
    whose anchor is a float32 3x3 stride-1 NCHW convolution (TOPI's ``conv2d_nchw``, its padding a block
    before it); else :class:`Unsupported`."""
    import tvm
    from tvm import s_tir, tirx

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    anchor = sch.get(anchor_block(sch))
    if len(anchor.reads) != 2 or len(anchor.iter_vars) != 7 or str(anchor.writes[0].source.dtype) != "float32":
        raise Unsupported("the anchor is not a convolution of data and weight")
    source, weight = anchor.reads[0].source, anchor.reads[1].source
    n, k, oh, ow = (int(d) for d in anchor.writes[0].source.shape)
    kk, c, r, s = (int(d) for d in weight.shape)
    y, x = anchor.reads[0].region[2].min, anchor.reads[0].region[3].min
    if (r, s, kk) != (3, 3, k) or not all(isinstance(i, tirx.Add) and isinstance(i.a, tirx.Var)
                                         and isinstance(i.b, tirx.Var) for i in (y, x)):
        raise Unsupported("not a 3x3 convolution with stride 1 and no dilation")
    params = list(func.params)
    if any(source.same_as(b) for b in params):  # no padding block
        data, pad = source, 0
    else:
        producer = sch.get(sch.get_producers(anchor_block(sch))[0])
        data = producer.reads[0].source
        if len(producer.reads) != 1 or not any(data.same_as(b) for b in params):
            raise Unsupported("the convolution's input is computed in the operator")
        pad = (int(source.shape[2]) - int(data.shape[2])) // 2
        offsets = [_offset(producer.reads[0].region[i].min) for i in (2, 3)]
        if int(source.shape[3]) - int(data.shape[3]) != 2 * pad or offsets != [pad, pad]:
            raise Unsupported("padding that is not the same on every side")
    _, cd, h, w = (int(d) for d in data.shape)
    if cd != c or (oh, ow) != (h + 2 * pad - 2, w + 2 * pad - 2):
        raise Unsupported("output size does not follow from a stride-1 convolution")
    return ConvShape(n, c, h, w, k, pad, oh, ow), anchor.name_hint, data, weight


def _offset(index: Any) -> int:
    """``p`` of a padding block's read index ``y - p`` (0 for ``y``)."""
    import tvm
    from tvm import tirx

    if isinstance(index, tirx.Var):
        return 0
    if isinstance(index, tirx.Sub) and isinstance(index.a, tirx.Var) and isinstance(index.b, tvm.tirx.IntImm):
        return int(index.b.value)
    raise Unsupported(f"a padding read at {index}")


def conv_shape(workload: Workload) -> ConvShape:
    return _shape(workload.prim_func())[0]


def applies(workload: Workload) -> bool:
    """A fused operator whose anchor is a 3x3 stride-1 float32 convolution and whose epilogue is elementwise."""
    return _rebuilds(workload.prim_func())


@functools.lru_cache(maxsize=64)
def _rebuilds(func: Any) -> bool:
    try:
        compute(func, TILES[0])
    except Unsupported:
        return False
    return True


def compute(func: Any, m: int, prepacked: bool = True) -> IRModule:
    """The fused PrimFunc ``func`` with its convolution as Winograd F(m x m, 3 x 3), the weight's transform
    marked to be computed once where ``prepacked``; same parameters."""
    import tvm
    from tvm import te

    shape, anchor, data, weight = _shape(func)
    params = list(func.params)
    holders = [te.placeholder(tuple(b.shape), str(b.dtype), name="weight" if b.same_as(weight) else b.name)
               for b in params[:-1]]  # (the in-operator transform reads the buffer so named)
    index = lambda buffer: next(i for i, b in enumerate(params) if b.same_as(buffer))
    conv = stages(holders[index(data)], holders[index(weight)], shape, m, prepacked)
    reads = [(b, (lambda t: lambda i: t[tuple(i)])(holder)) for b, holder in zip(params, holders)]
    value = epilogue(func, anchor, conv, reads)
    result = te.compute(tuple(params[-1].shape), lambda *i: value(i), name="output")
    return tvm.IRModule({"main": te.create_prim_func([*holders, result])})


def scheduled(func: Any, config: Config) -> IRModule:
    """The fused PrimFunc ``func`` as Winograd, scheduled by ``config``'s ``winograd_*`` knobs (a config from
    before ``winograd_in_op``: the weight transformed once)."""
    prepacked = not config.get("winograd_in_op", 0)
    return schedule(compute(func, config["winograd_tile"], prepacked), config, _shape(func)[0], prepacked)


REBUILD_ANNOTATION = "opbench.winograd"  # on a fused PrimFunc's root block: the config to rebuild it with (JSON)


def mark(sch: Any, config: Config) -> None:
    """TrialRecord ``config`` on the fused PrimFunc's root block (a trace MetaSchedule's database replays)."""
    sch.annotate(sch.get_sblock("root"), REBUILD_ANNOTATION, json.dumps(dict(config), sort_keys=True))


def rebuild_marked(mod: Any) -> Any:
    """``mod`` (a Relax module) with each PrimFunc :func:`mark` marked replaced by its Winograd rebuild, its
    attributes kept and marked scheduled."""
    from tvm import tirx

    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        config = func.body.block.annotations.get(REBUILD_ANNOTATION)
        if config is None:
            continue
        rebuilt = scheduled(func, json.loads(str(config)))["main"]
        mod[gvar] = tirx.PrimFunc(rebuilt.params, rebuilt.body, attrs=func.attrs).with_attr("tirx.is_scheduled", True)
    return mod
