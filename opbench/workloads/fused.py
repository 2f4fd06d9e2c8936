"""A fused operator of a real model as a workload: ``fused:model=bert-base@tiny,func=fused_matmul_add2``
(also written ``model:bert-base@tiny/fused_matmul_add2``). Its PrimFunc comes from the model's
extraction (``opbench model-ops``, cached on disk); the reference is that PrimFunc as TVM lowers it
unscheduled, so a tuned schedule is checked against the model's own computation."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from opbench.exceptions import WorkloadError
from opbench.workloads._base import Axis, Operator, Params

if TYPE_CHECKING:
    from tvm.s_tir import Schedule

MODEL_PREFIX = "model:"
# (model, func, batch, seq_len) -> (the model's inputs..., the fused PrimFunc): registered by the layer above the
# catalogue that extracts models (opbench.workloads.models), which the entry points and studies import
OpLoader = Callable[[str, str, int, int], tuple[Any, Any]]
_loaders: list[OpLoader] = []


def register_op_loader(loader: OpLoader) -> None:
    """Where fused workloads come from (the last one registered is used)."""
    _loaders.append(loader)

REDUCE = 2  # tirx.IterVar.CommReduce


def child_blocks(sch: Schedule) -> list[Any]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def blocks_after(sch: Schedule, block: Any) -> list[str]:
    """The names of the root's blocks after ``block`` (a fused operator's epilogue), in order."""
    names = [sch.get(b).name_hint for b in child_blocks(sch)]
    return names[names.index(sch.get(block).name_hint) + 1:]


def inline_side_blocks(sch: Schedule, block: Any) -> list[str]:
    """Inline the blocks after ``block`` that do not read what it computes (a quantized operator's zero point
    times its weight's sums) into the blocks that read them; the names of the rest of its epilogue, in order."""
    derived, epilogue = {sch.get(block).name_hint}, []
    for name in blocks_after(sch, block):
        if {sch.get(p).name_hint for p in sch.get_producers(sch.get_sblock(name))} & derived:
            derived.add(name)
            epilogue.append(name)
        else:
            sch.compute_inline(sch.get_sblock(name))
    return epilogue


def anchor_block(sch: Schedule) -> Any:
    """The last block with a reduction axis, else the last block."""
    blocks = child_blocks(sch)
    reducing = [b for b in blocks if any(int(iv.iter_type) == REDUCE for iv in sch.get(b).iter_vars)]
    return (reducing or blocks)[-1]


def anchor_axes(func: Any) -> list[Axis]:
    """The anchor block's axes of a PrimFunc: spatial first, then reduction, as the template sees them."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    ivs = sch.get(anchor_block(sch)).iter_vars
    axes = [Axis(str(iv.var), int(iv.dom.extent), int(iv.iter_type) == REDUCE) for iv in ivs]
    return [a for a in axes if not a.reduce] + [a for a in axes if a.reduce]


ROWWISE_BLOCKS = ("T_softmax_norm", "T_layer_norm")  # TOPI's output stages of a row-wise softmax / layer norm


def anchor_pattern(func: Any) -> str:
    """What a PrimFunc's anchor block computes, where a template of its own applies, else "":

    - ``conv2d``: an NCHW convolution with one group (TOPI's ``conv2d_nchw``: loops n, k, y, x |
      c, r, s, reading data ``(N, C, H, W)`` and weight ``(K, C, R, S)``);
    - ``depthwise_conv2d``: one with a group per channel (``group_conv2d_nchw``, c of extent 1,
      data ``(N, K, H, W)``, weight ``(K, 1, R, S)``);
    - ``matmul``: a (batched) matmul (loops ..., i, j | k, reading two buffers);
    - ``rowwise``: a softmax or layer norm over the last axis (row reductions, then an elementwise output)."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    names = [sch.get(b).name_hint for b in child_blocks(sch)]
    block = sch.get(anchor_block(sch))
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    kinds = [int(iv.iter_type) == REDUCE for iv in block.iter_vars]
    shapes = [[int(d) for d in r.source.shape] for r in block.reads]  # TVM 0.27: a region's buffer is its source
    if any(name in ROWWISE_BLOCKS for name in names) and kinds[-1] and sum(kinds) == 1:
        return "rowwise"
    if len(shapes) != 2:
        return ""
    if block.name_hint.startswith(("conv2d_nchw", "group_conv2d_nchw")) and kinds == [False] * 4 + [True] * 3:
        _, k, _, _, c, r, s = extents
        if len(shapes[0]) != 4 or shapes[1] != [k, c, r, s]:
            return ""
        if block.name_hint.startswith("conv2d_nchw") and shapes[0][1] == c:
            return "conv2d"
        return "depthwise_conv2d" if c == 1 and shapes[0][1] == k else ""
    if "matmul" in block.name_hint and len(kinds) >= 3 and kinds == [False] * (len(kinds) - 1) + [True]:
        return "matmul"
    return ""


POOL_BLOCKS = ("pool_max", "pool_sum")  # TOPI's pooling windows (max; average: a sum, then its division)


def pool_window(func: Any) -> str:
    """What a PrimFunc's anchor is as a pooling window (one of :data:`POOL_BLOCKS`): "padded" where it reads a
    padding stage of the function (the anchor's one producer) whose border a channel's plane reads (a ceil-mode
    pooling's pads the bottom and right edges, which its windows may never reach), "plain" where it reads its input
    or an unread padding, "" where it is no pooling window."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    anchor = anchor_block(sch)
    if sch.get(anchor).name_hint not in POOL_BLOCKS:
        return ""
    producers = sch.get_producers(anchor)
    if len(producers) != 1:
        return "plain"
    sch.compute_at(producers[0], sch.get_loops(anchor)[1])  # one channel's plane, as the template computes it
    return "padded" if sch.can_decompose_padding(producers[0], sch.get_loops(producers[0])[-2]) else "plain"


@functools.cache
def _load(model: str, func: str, batch: int, seq_len: int) -> tuple[Any, Any]:
    if not _loaders:
        raise WorkloadError(f"{MODEL_PREFIX}{model}/{func}: model operators are loaded by opbench.workloads.models; "
                            "import it first")
    return _loaders[-1](model, func, batch, seq_len)


@functools.cache
def _reference_executable(model: str, func: str, batch: int, seq_len: int) -> Any:
    import tvm

    from opbench.hardware.targets import make_target

    return tvm.compile(tvm.IRModule({"main": _load(model, func, batch, seq_len)[1]}), make_target("llvm", 1))


@functools.cache
def _anchor_pattern(model: str, func: str, batch: int, seq_len: int) -> str:
    return anchor_pattern(_load(model, func, batch, seq_len)[1])


@functools.cache
def _pool_window(model: str, func: str, batch: int, seq_len: int) -> str:
    return pool_window(_load(model, func, batch, seq_len)[1])


@functools.cache
def _anchor_operands(model: str, func: str, batch: int, seq_len: int) -> tuple[str, ...]:
    """The dtypes of the buffers the anchor block reads, in order."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": _load(model, func, batch, seq_len)[1]}))
    return tuple(str(r.source.dtype) for r in sch.get(anchor_block(sch)).reads)


@functools.cache
def _axes(model: str, func: str, batch: int, seq_len: int) -> tuple[Axis, ...]:
    """The anchor block's loops (found on a fresh Schedule: once per operator, not per record)."""
    return tuple(anchor_axes(_load(model, func, batch, seq_len)[1]))


def model_spec(text: str) -> str:
    """``model:NAME/FUNC[,batch=B,seq_len=S]`` as the canonical ``fused:model=NAME,func=FUNC,...`` spec."""
    body, _, options = text.removeprefix(MODEL_PREFIX).partition(",")
    name, slash, func = body.rpartition("/")
    if not slash or not name or not func:
        raise WorkloadError(f"'{text}': a model operator is written model:MODEL/FUNCTION[,batch=B,seq_len=S] "
                            "(functions: `opbench model-ops MODEL`)")
    return f"fused:model={name},func={func}" + (f",{options}" if options else "")


def model_name(model: str, func: str, batch: int, seq_len: int) -> str:
    """The short name of a model operator (what ``model-ops`` prints and ``tune`` takes)."""
    options = "".join(f",{k}={v}" for k, v, default in (("batch", batch, 1), ("seq_len", seq_len, 128))
                      if v != default)
    return f"{MODEL_PREFIX}{model}/{func}{options}"


class Fused(Operator):
    name = "fused"
    keys = ("model", "func")
    options = {"batch": 1, "seq_len": 128}
    anchor = ""
    description = "a fused operator of a model (opbench model-ops MODEL lists them)"
    torch_baseline = False  # the model as a whole has one (tune-model); a fused piece of it does not

    def _key(self, p: Params) -> tuple[str, str, int, int]:
        return str(p["model"]), str(p["func"]), int(p["batch"]), int(p["seq_len"])

    def op(self, p: Params) -> Any:
        return _load(*self._key(p))[0]

    def check(self, p: Params) -> None:
        op = self.op(p)
        if op.outputs != 1:
            raise WorkloadError(f"{p['func']} writes {op.outputs} outputs; only single-output operators are tunable")

    def input_shapes(self, p: Params) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self.op(p).shapes[:-1]]

    def output_shape(self, p: Params) -> tuple[int, ...]:
        return tuple(self.op(p).shapes[-1])

    def input_dtypes(self, p: Params, dtype: str) -> list[str]:
        return [str(b.dtype) for b in self.prim_func(p, dtype).params[:-1]]  # e.g. int32 indices of a take

    def output_dtype(self, p: Params, dtype: str) -> str:
        return self.op(p).dtype

    def axes(self, p: Params) -> list[Axis]:
        return list(_axes(*self._key(p)))

    def kind(self, p: Params) -> str:
        """``fused_conv2d``, ``fused_depthwise_conv2d``, ``fused_matmul`` or ``fused_rowwise`` where the
        anchor is one (:func:`anchor_pattern`), else ``fused``."""
        pattern = _anchor_pattern(*self._key(p))
        return f"{self.name}_{pattern}" if pattern else self.name

    def flops(self, p: Params) -> float:
        return self.op(p).flops

    def pool_window(self, p: Params) -> str:
        """"padded", "plain" or "": :func:`pool_window`."""
        return _pool_window(*self._key(p))

    def anchor_operands(self, p: Params) -> tuple[str, ...]:
        """The dtypes its anchor block reads (a quantized model's matmul: uint8 activations, int8 weights)."""
        return _anchor_operands(*self._key(p))

    def task_key(self, p: Params, dtype: str) -> str:
        """``tir:<kind>:<buffer shapes>:<dtype>:<structural hash of the PrimFunc>``: the computation itself,
        whichever model it comes from."""
        import tvm_ffi

        shapes = ";".join("x".join(map(str, s)) for s in self.op(p).shapes)
        digest = tvm_ffi.structural_hash(self.prim_func(p, dtype)) & 0xFFFFFFFFFFFF
        return f"tir:{self.kind(p)}:{shapes}:{self.op(p).dtype}:{digest:012x}"

    def define(self, p: Params, dtype: str) -> list[Any]:
        raise WorkloadError(f"{p['func']} is TensorIR from a model, not a TE definition")

    def prim_func(self, p: Params, dtype: str) -> Any:
        return _load(*self._key(p))[1]

    def source_model(self, p: Params) -> str:
        return str(p["model"])

    def torch_impl(self, p: Params) -> Any:
        raise WorkloadError(f"no PyTorch implementation of the fused operator {p['func']}")

    def reference(self, arrays: list[np.ndarray], p: Params) -> np.ndarray:
        """The unscheduled PrimFunc's output, as TVM's default lowering computes it."""
        import tvm

        dev = tvm.cpu()
        args = [tvm.runtime.tensor(a, dev) for a in arrays]
        args.append(tvm.runtime.tensor(np.zeros(self.output_shape(p), self.op(p).dtype), dev))
        _reference_executable(*self._key(p))["main"](*args)
        return args[-1].numpy()
