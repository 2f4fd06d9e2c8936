"""int8 quantization of a model's Relax module, as users most often quantize transformers for CPUs (ONNX Runtime's
``quantize_dynamic``, PyTorch's dynamic quantization): every matrix product by a constant weight becomes a u8 x i8
product summed into i32 (the catalogue's ``dtype=int8``, :mod:`opbench.space.dot_product`'s kernels), its weight
quantized once per output column (symmetric, i8), its activations per tensor at run time (asymmetric, u8: the range
of each call's values, zero included), and the sum scaled back to fp32:

    y = (acc - zp * colsum(Wq)) * (scale * w_scale),  acc = sum_k xq[k] * Wq[k, n],  xq = clip(round(x / scale) + zp)

An activation is quantized by one kernel of its own (:func:`dynamic_quantize`, scheduled here: one vectorised pass
for the range, one for the values), as ONNX Runtime's ``DynamicQuantizeLinear`` is one operator: written as Relax
operators, it is a full reduction TVM lowers to a serial loop, twice, and five kernels on scalars.
"""
from __future__ import annotations

from typing import Any

import numpy as np

INT8_SUFFIX = "+int8"  # a model name's suffix: the model quantized (``bert-base@tiny+int8``)
AGREEMENT = 0.99  # the cosine similarity a quantized model's output must reach against the fp32 model's


def quantize_matmuls(mod: Any) -> Any:
    """``mod`` with every ``matmul(x, W)`` whose ``W`` is a 2-D float32 constant computed in int8 (see the module's
    docstring); its constants folded first, so a transposed weight is a constant too."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    mod = relax.transform.FoldConstant()(mod)
    data, weight = wildcard(), is_const()
    product = is_op("relax.matmul")(data, weight)
    quantizers: dict[int, Any] = {}  # an activation's size -> its dynamic_quantize kernel's GlobalVar
    kernels = relax.BlockBuilder()

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        w = matches[weight].value.numpy()
        x = matches[data]
        if w.ndim != 2 or w.dtype != np.float32 or str(x.ty.dtype) != "float32":
            return expr
        size = int(np.prod([int(d) for d in x.ty.shape]))
        if size not in quantizers:
            quantizers[size] = kernels.add_func(dynamic_quantize(size), "dynamic_quantize")
        return _int8_matmul(x, w, quantizers[size])

    out = mod.clone()
    for name, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[name] = rewrite_call(product, rewrite, func)
    for gvar, kernel in kernels.get().functions.items():
        out[gvar] = kernel
    return tvm.ir.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])(out)


def _int8_matmul(x: Any, w: np.ndarray, quantizer: Any) -> Any:
    """The int8 product of activations ``x`` (..., K) by the fp32 weight ``w`` (K, N), back in fp32, ``x``
    quantized by the ``quantizer`` kernel (:func:`dynamic_quantize` of its size)."""
    from tvm import relax
    from tvm.relax import op

    w_scale = np.maximum(np.abs(w).max(axis=0), np.finfo(np.float32).tiny) / 127.0
    w_q = np.clip(np.rint(w / w_scale), -127, 127).astype("int8")
    col_sum = w_q.astype("int32").sum(axis=0).astype("float32")
    f32 = lambda value: relax.const(np.asarray(value, "float32"))
    scalar = relax.TensorType((), "float32")
    size = int(np.prod([int(d) for d in x.ty.shape]))
    quantized = relax.call_tir(quantizer, [op.reshape(x, (size,))], [relax.TensorType((size,), "uint8"), scalar, scalar])
    x_q, scale, zero_point = (relax.TupleGetItem(quantized, i) for i in range(3))
    x_q = op.reshape(x_q, x.ty.shape)  # both reshapes views once built (RewriteDataflowReshape)
    acc = op.matmul(x_q, relax.const(w_q), out_dtype="int32")
    return (op.astype(acc, "float32") - zero_point * f32(col_sum)) * (scale * f32(w_scale))


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
