"""Matrix products: matmul, batch_matmul and dense (weights pre-packed as inference compilers do)."""
from __future__ import annotations

import numpy as np

from opbench.exceptions import WorkloadError
from opbench.workloads._base import FLOAT_DTYPES, LOW_PRECISION, Axis, Operator, Params, positive, widen


class MatMul(Operator):
    name = "matmul"
    keys = ("m", "n", "k")
    anchor = "C"
    description = "C[m,n] = A[m,k] @ B[k,n]"
    dtypes = (*FLOAT_DTYPES, *LOW_PRECISION)

    def check(self, p: Params) -> None:
        positive(p, *self.keys)

    def input_shapes(self, p):
        return [(p["m"], p["k"]), (p["k"], p["n"])]

    def output_shape(self, p):
        return (p["m"], p["n"])

    def axes(self, p):
        return [Axis("i", p["m"]), Axis("j", p["n"]), Axis("k", p["k"], reduce=True)]

    def flops(self, p):
        return 2.0 * p["m"] * p["n"] * p["k"]

    def define(self, p, dtype):
        from tvm import te

        (a_type, b_type), acc = self.input_dtypes(p, dtype), self.output_dtype(p, dtype)
        a = te.placeholder((p["m"], p["k"]), a_type, name="A")
        b = te.placeholder((p["k"], p["n"]), b_type, name="B")
        k = te.reduce_axis((0, p["k"]), name="k")
        c = te.compute((p["m"], p["n"]), lambda i, j: te.sum(widen(a[i, k], acc) * widen(b[k, j], acc), axis=k), name="C")
        return [a, b, c]

    numpy_impl = True

    def reference(self, arrays, p):
        return arrays[0] @ arrays[1]

    def torch_impl(self, p):
        import torch

        return torch.matmul


class BatchMatMul(Operator):
    name = "batch_matmul"
    keys = ("b", "m", "n", "k")
    anchor = "C"
    description = "C[b,m,n] = A[b,m,k] @ B[b,k,n]"
    dtypes = (*FLOAT_DTYPES, *LOW_PRECISION)

    def check(self, p):
        positive(p, *self.keys)

    def input_shapes(self, p):
        return [(p["b"], p["m"], p["k"]), (p["b"], p["k"], p["n"])]

    def output_shape(self, p):
        return (p["b"], p["m"], p["n"])

    def axes(self, p):
        return [Axis("b", p["b"]), Axis("i", p["m"]), Axis("j", p["n"]), Axis("k", p["k"], reduce=True)]

    def flops(self, p):
        return 2.0 * p["b"] * p["m"] * p["n"] * p["k"]

    def define(self, p, dtype):
        from tvm import te

        (a_type, b_type), acc = self.input_dtypes(p, dtype), self.output_dtype(p, dtype)
        a = te.placeholder((p["b"], p["m"], p["k"]), a_type, name="A")
        b = te.placeholder((p["b"], p["k"], p["n"]), b_type, name="B")
        k = te.reduce_axis((0, p["k"]), name="k")
        c = te.compute((p["b"], p["m"], p["n"]),
                       lambda bb, i, j: te.sum(widen(a[bb, i, k], acc) * widen(b[bb, k, j], acc), axis=k), name="C")
        return [a, b, c]

    numpy_impl = True

    def reference(self, arrays, p):
        return np.matmul(arrays[0], arrays[1])

    def torch_impl(self, p):
        import torch

        return torch.bmm


class Dense(Operator):
    """A fully connected layer. The weight is stored (k, n): inference compilers pre-pack constant
    weights, and this is the layout that lets the output axis vectorise."""

    name = "dense"
    keys = ("m", "n", "k")
    options = {"bias": 1}
    anchor = "dense"
    description = "Y[m,n] = X[m,k] @ W[k,n] (+ bias[n])"
    dtypes = (*FLOAT_DTYPES, *LOW_PRECISION)

    def check(self, p):
        positive(p, "m", "n", "k")
        if p["bias"] not in (0, 1):
            raise WorkloadError(f"key 'bias' must be 0 or 1, got {p['bias']!r}")

    def input_shapes(self, p):
        shapes = [(p["m"], p["k"]), (p["k"], p["n"])]
        return shapes + [(p["n"],)] if p["bias"] else shapes

    def output_shape(self, p):
        return (p["m"], p["n"])

    def axes(self, p):
        return [Axis("i", p["m"]), Axis("j", p["n"]), Axis("k", p["k"], reduce=True)]

    def flops(self, p):
        return 2.0 * p["m"] * p["n"] * p["k"] + (p["m"] * p["n"] if p["bias"] else 0)

    def define(self, p, dtype):
        from tvm import te

        x_type, w_type, *bias_type = self.input_dtypes(p, dtype)
        acc = self.output_dtype(p, dtype)
        x = te.placeholder((p["m"], p["k"]), x_type, name="X")
        w = te.placeholder((p["k"], p["n"]), w_type, name="W")
        k = te.reduce_axis((0, p["k"]), name="k")
        y = te.compute((p["m"], p["n"]), lambda i, j: te.sum(widen(x[i, k], acc) * widen(w[k, j], acc), axis=k), name="dense")
        if not p["bias"]:
            return [x, w, y]
        bias = te.placeholder((p["n"],), bias_type[0], name="bias")
        out = te.compute((p["m"], p["n"]), lambda i, j: y[i, j] + widen(bias[j], acc), name="bias_add")
        return [x, w, bias, out]

    numpy_impl = True

    def reference(self, arrays, p):
        out = arrays[0] @ arrays[1]
        return out + arrays[2] if p["bias"] else out

    def torch_impl(self, p):
        import torch

        return (lambda x, w, b: torch.addmm(b, x, w)) if p["bias"] else torch.matmul
