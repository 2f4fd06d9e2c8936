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

Static quantization (``+int8-static``, as ONNX Runtime's ``quantize_static`` and OpenVINO's NNCF quantize): each
activation's range is calibrated once, on sample inputs (:mod:`.calibrate`), so its scale and zero point are constants
and its quantization is elementwise Relax operators, which the build fuses into the kernel that makes the activation.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opbench.workloads._base import INT8_STEP
from opbench.workloads.models.calibrate import Ranges, activation_ranges, samples, site

INT8_SUFFIX = "+int8"  # a model name's suffix: the model quantized (``bert-base@tiny+int8``)
STATIC_SUFFIX = "+int8-static"  # the model quantized with calibrated, constant activation scales
AGREEMENT = 0.99  # the cosine similarity a quantized model's output must reach against the fp32 model's


def quantize_products(mod: Any, ranges: Ranges | None = None) -> Any:
    """``mod`` with every product :func:`rewrite_products` visits computed in int8 (see the module's docstring; a
    convolution's weight per output channel): its activations quantized at run time, or, given their calibrated
    ``ranges`` (:func:`~opbench.workloads.models.calibrate.activation_ranges`), with constant scales."""
    import tvm
    from tvm import relax

    activations: _Dynamic | _Static = _Dynamic() if ranges is None else _Static(ranges)

    def int8(call: Any, x: Any, w: np.ndarray) -> Any:
        return (_int8_matmul if call.op.name == "relax.matmul" else _int8_conv2d)(call, x, w, activations)

    out = rewrite_products(mod, int8)
    activations.add_to(out)
    return tvm.ir.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])(out)


def rewrite_products(mod: Any, rewrite: Callable[[Any, Any, np.ndarray], Any]) -> Any:
    """``mod``, its constants folded first (so that a transposed weight is a constant too), with ``rewrite(call, x,
    weight)`` in place of every ``matmul(x, W)`` and ``conv2d(x, W)`` whose ``W`` is a constant (``weight``, its
    value), each call visited once; ``rewrite`` returns ``call`` to keep it."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Products(relax.PyExprMutator):
        def visit_call_(self, op: Any) -> Any:
            call = self.visit_expr_post_order(op)
            if (getattr(call.op, "name", "") in ("relax.matmul", "relax.nn.conv2d")
                    and isinstance(call.args[1], tvm.ir.expr.Constant)):
                return rewrite(call, call.args[0], call.args[1].value.numpy())
            return call

    mod = relax.transform.FoldConstant()(mod)
    out = mod.clone()
    for name, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[name] = Products(mod).visit_expr(func)
    return out


def quantized_as_named(mod: Any, model: str, inputs: list[np.ndarray]) -> Any:
    """``mod`` quantized as ``model``'s name asks (:data:`SUFFIXES`): dynamic, or static, calibrated on samples drawn
    like ``inputs`` (its example inputs); unchanged for an fp32 name."""
    if model.endswith(STATIC_SUFFIX):
        return quantize_products(mod, activation_ranges(mod, rewrite_products, samples(inputs)))
    return quantize_products(mod) if is_quantized(model) else mod


class _Dynamic:
    """Activations quantized at run time by :func:`dynamic_quantize` kernels, one kernel per activation size."""

    def __init__(self) -> None:
        from tvm import relax

        self._kernels = relax.BlockBuilder()
        self._by_size: dict[int, Any] = {}  # an activation's size -> its kernel's GlobalVar

    def quantized(self, x: Any, padding: list[int], key: str) -> tuple[Any, Any, Any]:
        """``x`` (fp32) padded by ``padding`` (``nn.pad``'s widths, zeros; none if empty), then quantized: its u8
        values, its scale and its zero point."""
        from tvm import relax
        from tvm.relax import op

        shape = tuple(int(d) + sum(padding[2 * i:2 * i + 2]) for i, d in enumerate(x.ty.shape))
        x = op.nn.pad(x, padding) if any(padding) else x
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


class _Static:
    """Activations quantized with constant scales from their calibrated ranges: elementwise operators, which the
    build fuses into the kernel that makes the activation; a convolution's input then padded with its zero point."""

    def __init__(self, ranges: Ranges) -> None:
        self._ranges = ranges

    def quantized(self, x: Any, padding: list[int], key: str) -> tuple[Any, Any, Any]:
        """``x`` (fp32) quantized by its site's (``key``) range, then padded by ``padding`` with its zero point."""
        from tvm.relax import op

        if key not in self._ranges:
            raise ValueError(f"no calibrated range for the product of weight {key}")
        low, high = self._ranges[key]
        scale = max((high - low) / 255, 1e-12)
        zero_point = float(np.round(-low / scale))
        shifted = op.add(op.round(op.multiply(x, _const(np.float32(1 / scale)))), _const(np.float32(zero_point)))
        x_q = op.astype(op.clip(shifted, 0.0, 255.0), "uint8")
        if any(padding):
            x_q = op.nn.pad(x_q, padding, pad_value=zero_point)
        return x_q, _const(np.float32(scale)), _const(np.float32(zero_point))

    def add_to(self, mod: Any) -> None:
        """Nothing to add: the quantization is Relax operators."""


def _int8_matmul(expr: Any, x: Any, w: np.ndarray, activations: _Dynamic | _Static) -> Any:
    """``expr``, the product of activations ``x`` (..., K) by the fp32 weight ``w`` (K, N), in int8 (back in fp32)."""
    from tvm.relax import op

    if w.ndim != 2 or w.dtype != np.float32 or str(x.ty.dtype) != "float32":
        return expr
    w_q, w_scale, w_sum = _per_channel(w, 1)
    x_q, scale, zero_point = activations.quantized(x, [], site(w))
    return _dequantized(op.matmul(x_q, _const(w_q), out_dtype="int32"), scale, zero_point, w_sum, w_scale)


def _int8_conv2d(expr: Any, x: Any, w: np.ndarray, activations: _Dynamic | _Static) -> Any:
    """``expr``, an NCHW convolution of ``x`` by the fp32 weight ``w`` (OIHW), in int8 (back in fp32). ``x`` is
    padded by its zero point (the value a padded zero quantizes to, as the sum's correction assumes), its channels
    too, to a multiple of :data:`INT8_STEP` (the weight's with zeros)."""
    from tvm.relax import op

    attrs = expr.attrs
    if (w.ndim != 4 or w.dtype != np.float32 or str(x.ty.dtype) != "float32" or int(attrs.groups) != 1
            or (str(attrs.data_layout), str(attrs.kernel_layout)) != ("NCHW", "OIHW")):
        return expr
    top, left, bottom, right = (int(p) for p in attrs.padding)
    extra = -int(x.ty.shape[1]) % INT8_STEP  # input channels of zeros, weighted by zeros, up to a whole instruction's group
    x_q, scale, zero_point = activations.quantized(x, [0, 0, 0, extra, top, bottom, left, right], site(w))
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


SUFFIXES = {"int8": INT8_SUFFIX, "int8-static": STATIC_SUFFIX}  # a quantized --dtype -> its model name's suffix
MODEL_DTYPES = ("float32", *SUFFIXES)  # what a model's --dtype takes


def with_dtype(model: str, dtype: str) -> str:
    """The model's name for ``dtype`` (a :data:`MODEL_DTYPES`): a quantized one adds its suffix."""
    return model + SUFFIXES[dtype] if dtype in SUFFIXES and not is_quantized(model) else model


def quantized_suffix(model: str) -> str:
    """The suffix of a quantized model's name (:data:`SUFFIXES`), or ""."""
    return next((suffix for suffix in SUFFIXES.values() if model.endswith(suffix)), "")


def is_quantized(model: str) -> bool:
    """Whether the model's name asks for it quantized (a suffix of :data:`SUFFIXES`)."""
    return bool(quantized_suffix(model))


def unquantized(model: str) -> str:
    """The model's name without its quantization suffix."""
    return model.removesuffix(quantized_suffix(model))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine similarity of two outputs, flattened (1.0: the same direction)."""
    a, b = np.asarray(a, "float64").ravel(), np.asarray(b, "float64").ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), np.finfo(np.float64).tiny))
