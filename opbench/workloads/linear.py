"""Matrix products: matmul, batch_matmul and dense (weights pre-packed as inference compilers do)."""
from __future__ import annotations

import numpy as np

from opbench.exceptions import WorkloadError
from opbench.workloads._base import Axis, Operator, Params, positive


class MatMul(Operator):
    name = "matmul"
    keys = ("m", "n", "k")
    anchor = "C"
    description = "C[m,n] = A[m,k] @ B[k,n]"

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

        a = te.placeholder((p["m"], p["k"]), dtype, name="A")
        b = te.placeholder((p["k"], p["n"]), dtype, name="B")
        k = te.reduce_axis((0, p["k"]), name="k")
        c = te.compute((p["m"], p["n"]), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
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

        a = te.placeholder((p["b"], p["m"], p["k"]), dtype, name="A")
        b = te.placeholder((p["b"], p["k"], p["n"]), dtype, name="B")
        k = te.reduce_axis((0, p["k"]), name="k")
        c = te.compute(
            (p["b"], p["m"], p["n"]), lambda bb, i, j: te.sum(a[bb, i, k] * b[bb, k, j], axis=k), name="C"
        )
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

        x = te.placeholder((p["m"], p["k"]), dtype, name="X")
        w = te.placeholder((p["k"], p["n"]), dtype, name="W")
        k = te.reduce_axis((0, p["k"]), name="k")
        y = te.compute((p["m"], p["n"]), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="dense")
        if not p["bias"]:
            return [x, w, y]
        bias = te.placeholder((p["n"],), dtype, name="bias")
        out = te.compute((p["m"], p["n"]), lambda i, j: y[i, j] + bias[j], name="bias_add")
        return [x, w, bias, out]

    numpy_impl = True

    def reference(self, arrays, p):
        out = arrays[0] @ arrays[1]
        return out + arrays[2] if p["bias"] else out

    def torch_impl(self, p):
        import torch

        return (lambda x, w, b: torch.addmm(b, x, w)) if p["bias"] else torch.matmul
