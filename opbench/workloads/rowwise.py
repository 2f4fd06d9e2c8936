"""Row-wise and elementwise operators: softmax, layer_norm (over the last axis) and add_relu."""
from __future__ import annotations

import math

import numpy as np

from opbench.workloads._base import Axis, Operator, positive
from opbench.workloads._torch import functional as _F


class _RowOp(Operator):
    """Operators over rows of an (m, n) matrix."""

    keys = ("m", "n")

    def check(self, p):
        positive(p, *self.keys)

    def input_shapes(self, p):
        return [(p["m"], p["n"])]

    def output_shape(self, p):
        return (p["m"], p["n"])

    def axes(self, p):
        return [Axis("i", p["m"]), Axis("j", p["n"])]


class Softmax(_RowOp):
    name = "softmax"
    anchor = "softmax"
    description = "softmax over the last axis of X[m,n]"

    def flops(self, p):
        return 5.0 * p["m"] * p["n"]

    def define(self, p, dtype):
        from tvm import te

        m, n = p["m"], p["n"]
        x = te.placeholder((m, n), dtype, name="X")
        k1 = te.reduce_axis((0, n), name="k1")
        mx = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="row_max")
        ex = te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]), name="exp")
        k2 = te.reduce_axis((0, n), name="k2")
        sm = te.compute((m,), lambda i: te.sum(ex[i, k2], axis=k2), name="row_sum")
        out = te.compute((m, n), lambda i, j: ex[i, j] / sm[i], name="softmax")
        return [x, out]

    numpy_impl = True

    def reference(self, arrays, p):
        x = arrays[0] - arrays[0].max(axis=1, keepdims=True)
        e = np.exp(x)
        return e / e.sum(axis=1, keepdims=True)

    def torch_impl(self, p):
        import torch

        return lambda x: torch.softmax(x, dim=-1)


class LayerNorm(_RowOp):
    name = "layer_norm"
    anchor = "layer_norm"
    description = "layer normalisation over the last axis of X[m,n], with gamma and beta"
    eps = 1e-5

    def input_shapes(self, p):
        return [(p["m"], p["n"]), (p["n"],), (p["n"],)]

    def flops(self, p):
        return 8.0 * p["m"] * p["n"]

    def define(self, p, dtype):
        from tvm import te, tirx

        m, n = p["m"], p["n"]
        x = te.placeholder((m, n), dtype, name="X")
        gamma = te.placeholder((n,), dtype, name="gamma")
        beta = te.placeholder((n,), dtype, name="beta")
        k1 = te.reduce_axis((0, n), name="k1")
        s = te.compute((m,), lambda i: te.sum(x[i, k1], axis=k1), name="row_sum")
        k2 = te.reduce_axis((0, n), name="k2")
        sq = te.compute((m,), lambda i: te.sum(x[i, k2] * x[i, k2], axis=k2), name="row_sqsum")
        inv_n = 1.0 / n

        def body(i, j):
            mean = s[i] * inv_n
            var = sq[i] * inv_n - mean * mean
            return (x[i, j] - mean) * tirx.rsqrt(var + self.eps) * gamma[j] + beta[j]

        out = te.compute((m, n), body, name="layer_norm")
        return [x, gamma, beta, out]

    numpy_impl = True

    def reference(self, arrays, p):
        x, gamma, beta = arrays
        mean = x.mean(axis=1, keepdims=True)
        var = x.var(axis=1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * gamma + beta

    def torch_impl(self, p):
        F = _F()
        return lambda x, g, b: F.layer_norm(x, (p["n"],), g, b, self.eps)


class AddRelu(Operator):
    name = "add_relu"
    keys = ("n", "c", "h", "w")
    anchor = "relu"
    description = "relu(A + B), a fused elementwise epilogue (e.g. a residual add)"

    def check(self, p):
        positive(p, *self.keys)

    def input_shapes(self, p):
        return [self.output_shape(p)] * 2

    def output_shape(self, p):
        return (p["n"], p["c"], p["h"], p["w"])

    def axes(self, p):
        return [Axis(a, p[key]) for a, key in zip(("n", "c", "y", "x"), self.keys)]

    def flops(self, p):
        return 2.0 * math.prod(self.output_shape(p))

    def define(self, p, dtype):
        from tvm import te, tirx

        shape = self.output_shape(p)
        a = te.placeholder(shape, dtype, name="A")
        b = te.placeholder(shape, dtype, name="B")
        add = te.compute(shape, lambda *i: a(*i) + b(*i), name="add")
        relu = te.compute(shape, lambda *i: tirx.max(add(*i), tirx.const(0, dtype)), name="relu")
        return [a, b, relu]

    numpy_impl = True

    def reference(self, arrays, p):
        return np.maximum(arrays[0] + arrays[1], 0)

    def torch_impl(self, p):
        import torch

        return lambda a, b: torch.relu(a + b)
