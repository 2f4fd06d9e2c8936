"""int8 quantization of a model's Relax module, as users most often quantize transformers for CPUs (ONNX Runtime's
``quantize_dynamic``, PyTorch's dynamic quantization): every matrix product by a constant weight becomes a u8 x i8
product summed into i32 (the catalogue's ``dtype=int8``, :mod:`opbench.space.dot_product`'s kernels), its weight
quantized once per output column (symmetric, i8), its activations per tensor at run time (asymmetric, u8: the range
of each call's values, zero included), and the sum scaled back to fp32:

    y = (acc - zp * colsum(Wq)) * (scale * w_scale),  acc = sum_k xq[k] * Wq[k, n],  xq = clip(round(x / scale) + zp)
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

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        w = matches[weight].value.numpy()
        x = matches[data]
        if w.ndim != 2 or w.dtype != np.float32 or str(x.ty.dtype) != "float32":
            return expr
        return _int8_matmul(x, w)

    out = mod.clone()
    for name, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[name] = rewrite_call(product, rewrite, func)
    return tvm.ir.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])(out)


def _int8_matmul(x: Any, w: np.ndarray) -> Any:
    """The int8 product of activations ``x`` (..., K) by the fp32 weight ``w`` (K, N), back in fp32."""
    from tvm import relax
    from tvm.relax import op

    w_scale = np.maximum(np.abs(w).max(axis=0), np.finfo(np.float32).tiny) / 127.0
    w_q = np.clip(np.rint(w / w_scale), -127, 127).astype("int8")
    col_sum = w_q.astype("int32").sum(axis=0).astype("float32")
    f32 = lambda value: relax.const(np.asarray(value, "float32"))
    low, high = op.minimum(op.min(x), f32(0.0)), op.maximum(op.max(x), f32(0.0))
    scale = op.maximum((high - low) / f32(255.0), f32(1e-12))
    zero_point = op.round(op.negative(low) / scale)
    x_q = op.astype(op.clip(op.round(x / scale) + zero_point, 0, 255), "uint8")
    acc = op.matmul(x_q, relax.const(w_q), out_dtype="int32")
    return (op.astype(acc, "float32") - zero_point * f32(col_sum)) * (scale * f32(w_scale))


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
