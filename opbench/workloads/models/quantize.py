"""int8 quantization of a model's Relax module, as users most often quantize models for CPUs (ONNX Runtime's
``quantize_dynamic``; PyTorch's dynamic quantization, for Linear layers): every matrix product and convolution by a
constant weight becomes a u8 x i8 product summed into i32 (the catalogue's ``dtype=int8``), its weight quantized once
per output column or channel (symmetric, i8), its activations per tensor at run time (asymmetric, u8: the range of
each call's values, zero included), and the sum scaled back to fp32 (a convolution's input channels are padded with
zeros, weighted by zeros, to a whole dot-product instruction's group: an image's 3 to 4):

    y = (acc - zp * colsum(Wq)) * (scale * w_scale),  acc = sum_k xq[k] * Wq[k, n],  xq = clip(round(x / scale) + zp)

An activation is quantized by one kernel of its own (:func:`dynamic_quantize`, scheduled here: one vectorised pass
for the range, one for the values), as ONNX Runtime's ``DynamicQuantizeLinear`` is one operator: written as Relax
operators, it is a full reduction TVM lowers to a serial loop, twice, and five kernels on scalars.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from opbench.workloads._base import INT8_STEP

INT8_SUFFIX = "+int8"  # a model name's suffix: the model quantized (``bert-base@tiny+int8``)
AGREEMENT = 0.99  # the cosine similarity a quantized model's output must reach against the fp32 model's


def quantize_products(mod: Any) -> Any:
    """``mod`` with every ``matmul(x, W)`` whose ``W`` is a 2-D float32 constant, and every NCHW ``conv2d(x, W)``
    of one group whose ``W`` is a float32 constant, computed in int8 (see the module's docstring; a convolution's
    weight per output channel); its constants folded first, so a transposed weight is a constant too."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    mod = relax.transform.FoldConstant()(mod)
    data, weight = wildcard(), is_const()
    activations = _Activations()
    rewrites = [(is_op("relax.matmul")(data, weight), _int8_matmul), (is_op("relax.nn.conv2d")(data, weight), _int8_conv2d)]
    out = mod.clone()
    for name, func in mod.functions.items():
        if isinstance(func, relax.Function):
            for pattern, int8 in rewrites:
                func = rewrite_call(pattern, lambda expr, matches, int8=int8: int8(
                    expr, matches[data], matches[weight].value.numpy(), activations), func)
            out[name] = func
    activations.add_to(out)
    return tvm.ir.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])(out)


class _Activations:
    """Activations quantized by :func:`dynamic_quantize` kernels, one kernel per activation size."""

    def __init__(self) -> None:
        from tvm import relax

        self._kernels = relax.BlockBuilder()
        self._by_size: dict[int, Any] = {}  # an activation's size -> its kernel's GlobalVar

    def quantized(self, x: Any, shape: tuple[int, ...]) -> tuple[Any, Any, Any]:
        """``x`` (fp32, of ``shape``) quantized: its u8 values (of ``shape``), its scale and its zero point."""
        from tvm import relax
        from tvm.relax import op

        size = int(np.prod(shape))
        if size not in self._by_size:
            self._by_size[size] = self._kernels.add_func(dynamic_quantize(size), "dynamic_quantize")
        scalar = relax.TensorType((), "float32")
        call = relax.call_tir(self._by_size[size], [op.reshape(x, (size,))],
                              [relax.TensorType((size,), "uint8"), scalar, scalar])
        x_q, scale, zero_point = (relax.TupleGetItem(call, i) for i in range(3))
        return op.reshape(x_q, shape), scale, zero_point  # both reshapes views once built (RewriteDataflowReshape)

    def add_to(self, mod: Any) -> None:
        """Add the kernels to ``mod``, whose functions call them."""
        for gvar, kernel in self._kernels.get().functions.items():
            mod[gvar] = kernel


def _int8_matmul(expr: Any, x: Any, w: np.ndarray, activations: _Activations) -> Any:
    """``expr``, the product of activations ``x`` (..., K) by the fp32 weight ``w`` (K, N), in int8 (back in fp32)."""
    from tvm.relax import op

    if w.ndim != 2 or w.dtype != np.float32 or str(x.ty.dtype) != "float32":
        return expr
    w_q, w_scale, w_sum = _per_channel(w, 1)
    x_q, scale, zero_point = activations.quantized(x, tuple(int(d) for d in x.ty.shape))
    return _dequantized(op.matmul(x_q, _const(w_q), out_dtype="int32"), scale, zero_point, w_sum, w_scale)


def _int8_conv2d(expr: Any, x: Any, w: np.ndarray, activations: _Activations) -> Any:
    """``expr``, an NCHW convolution of ``x`` by the fp32 weight ``w`` (OIHW), in int8 (back in fp32). ``x`` is
    padded before it is quantized (a padded zero is then the zero point, as the sum's correction assumes), its
    channels too, to a multiple of :data:`INT8_STEP` (the weight's with zeros)."""
    from tvm.relax import op

    attrs = expr.attrs
    if (w.ndim != 4 or w.dtype != np.float32 or str(x.ty.dtype) != "float32" or int(attrs.groups) != 1
            or (str(attrs.data_layout), str(attrs.kernel_layout)) != ("NCHW", "OIHW")):
        return expr
    top, left, bottom, right = (int(p) for p in attrs.padding)
    n, c, h, width = (int(d) for d in x.ty.shape)
    extra = -c % INT8_STEP  # input channels of zeros, weighted by zeros, up to a whole instruction's group
    padding = [0, 0, 0, extra, top, bottom, left, right]
    padded = op.nn.pad(x, padding) if any(padding) else x
    x_q, scale, zero_point = activations.quantized(padded, (n, c + extra, h + top + bottom, width + left + right))
    w_q, w_scale, w_sum = _per_channel(np.pad(w, ((0, 0), (0, extra), (0, 0), (0, 0))), 0)
    acc = op.nn.conv2d(x_q, _const(w_q), strides=attrs.strides, padding=0, dilation=attrs.dilation, out_dtype="int32")
    return _dequantized(acc, scale, zero_point, w_sum.reshape(1, -1, 1, 1), w_scale.reshape(1, -1, 1, 1))


def _per_channel(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` quantized per index of ``axis`` (symmetric, i8): its i8 values, each channel's scale and the sum of
    each channel's i8 values (fp32), the last two 1-D."""
    others = tuple(a for a in range(w.ndim) if a != axis)
    w_scale = np.maximum(np.abs(w).max(axis=others), np.finfo(np.float32).tiny) / 127.0
    shape = [-1 if a == axis else 1 for a in range(w.ndim)]
    w_q = np.clip(np.rint(w / w_scale.reshape(shape)), -127, 127).astype("int8")
    return w_q, w_scale.astype("float32"), w_q.astype("int32").sum(axis=others).astype("float32")


def _dequantized(acc: Any, scale: Any, zero_point: Any, w_sum: np.ndarray, w_scale: np.ndarray) -> Any:
    """An i32 sum of u8 x i8 products back in fp32 (the module's docstring)."""
    from tvm.relax import op

    return (op.astype(acc, "float32") - zero_point * _const(w_sum)) * (scale * _const(w_scale))


def _const(value: np.ndarray) -> Any:
    from tvm import relax

    return relax.const(value)


LANES = 16  # floats a vector step of :func:`dynamic_quantize` takes (an AVX-512 register; LLVM splits it elsewhere)
PARALLEL_FROM = 1 << 15  # elements from which its passes run in parallel, in CHUNKS chunks (a pool wakes in microseconds)
CHUNKS = 8
KOPAQUE = 8  # TVM's OpPatternKind: never fused with its neighbours (it is scheduled already)


def dynamic_quantize(n: int) -> Any:
    """The kernel quantizing an fp32 tensor of ``n`` elements (flat) per tensor, as in the module's docstring:
    outputs its u8 values, its scale and its zero point. Scheduled here: its range in one vectorised pass (per
    chunk), then its values in another."""
    from tvm.script import tirx as T

    chunks = CHUNKS if n >= PARALLEL_FROM else 1
    per = n // chunks // LANES * LANES  # the elements of a chunk's vector steps; the rest: a scalar tail
    steps, tail0 = per // LANES, per * chunks

    def quantized(value: Any, scale: Any, zero_point: Any) -> Any:  # x * (1 / scale): LLVM hoists the division
        return T.Cast("uint8", T.max(T.min(T.round(value * (T.float32(1) / scale)) + zero_point, T.float32(255)),
                                     T.float32(0)))

    @T.prim_func(s_tir=True)  # a root block, which the build's passes look for
    def kernel(flat: T.Buffer((n,), "float32"), flat_q: T.Buffer((n,), "uint8"),  # type: ignore[valid-type]
               scale: T.Buffer((), "float32"), zero_point: T.Buffer((), "float32")) -> None:  # type: ignore[valid-type]
        T.func_attr({"s_tir": True, "tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": KOPAQUE})
        with T.sblock("root"):
            part = T.sblock_alloc_buffer((chunks, 2, LANES), "float32")  # each chunk's lanes' low and high
            for c in T.parallel(chunks):
                with T.sblock("range"):
                    T.reads(flat[c * per:c * per + per])
                    T.writes(part[c, 0:2, 0:LANES])
                    low = T.alloc_buffer((LANES,), "float32", scope="local")
                    high = T.alloc_buffer((LANES,), "float32", scope="local")
                    for lane in T.vectorized(LANES):
                        low[lane] = T.float32(0)  # zero is in every range
                        high[lane] = T.float32(0)
                    for i in range(steps):
                        for lane in T.vectorized(LANES):
                            low[lane] = T.min(low[lane], flat[c * per + i * LANES + lane])
                            high[lane] = T.max(high[lane], flat[c * per + i * LANES + lane])
                    for lane in T.vectorized(LANES):
                        part[c, 0, lane] = low[lane]
                        part[c, 1, lane] = high[lane]
            with T.sblock("scale"):  # each top-level statement a block of its own, as TVM's passes expect
                for c, lane in T.grid(chunks, LANES):  # into part[0, :, 0], with the tail's
                    part[0, 0, 0] = T.min(part[0, 0, 0], part[c, 0, lane])
                    part[0, 1, 0] = T.max(part[0, 1, 0], part[c, 1, lane])
                for t in range(n - tail0):
                    part[0, 0, 0] = T.min(part[0, 0, 0], flat[tail0 + t])
                    part[0, 1, 0] = T.max(part[0, 1, 0], flat[tail0 + t])
                scale[()] = T.max((part[0, 1, 0] - part[0, 0, 0]) / T.float32(255), T.float32(1e-12))
                zero_point[()] = T.round(-part[0, 0, 0] / scale[()])
            with T.sblock("values"):
                for c in T.parallel(chunks):
                    for i in range(steps):
                        for lane in T.vectorized(LANES):
                            flat_q[c * per + i * LANES + lane] = quantized(flat[c * per + i * LANES + lane],
                                                                           scale[()], zero_point[()])
                for t in range(n - tail0):
                    flat_q[tail0 + t] = quantized(flat[tail0 + t], scale[()], zero_point[()])

    return kernel.without_attr("global_symbol")  # named by the GlobalVar its module gives it


MODEL_DTYPES = ("float32", "int8")  # what a model's --dtype takes


def with_dtype(model: str, dtype: str) -> str:
    """The model's name for ``dtype`` (a :data:`MODEL_DTYPES`): int8 adds :data:`INT8_SUFFIX`."""
    return model + INT8_SUFFIX if dtype == "int8" and not is_quantized(model) else model


def is_quantized(model: str) -> bool:
    """Whether the model's name asks for it quantized (:data:`INT8_SUFFIX`)."""
    return model.endswith(INT8_SUFFIX)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine similarity of two outputs, flattened (1.0: the same direction)."""
    a, b = np.asarray(a, "float64").ravel(), np.asarray(b, "float64").ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), np.finfo(np.float64).tiny))
