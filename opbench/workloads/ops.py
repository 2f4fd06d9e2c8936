"""The operator catalogue: TE definitions (imported lazily), references, axes and FLOPs."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from opbench.exceptions import WorkloadError
from opbench.workloads._base import Axis, Operator, Params, conv_out, positive
from opbench.workloads.fused import Fused


def _F():
    import torch.nn.functional as F

    return F


def _pad(data, pad: int, value):
    """A padding stage named ``pad`` (NCHW, spatial dims only); identity when pad == 0."""
    from tvm import te, tirx

    if pad == 0:
        return data
    n, c, h, w = data.shape

    def body(nn, cc, yy, xx):
        inside = tirx.all(yy >= pad, yy < h + pad, xx >= pad, xx < w + pad)
        return tirx.if_then_else(inside, data[nn, cc, yy - pad, xx - pad], value)

    return te.compute((n, c, h + 2 * pad, w + 2 * pad), body, name="pad")


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


class Conv2d(Operator):
    name = "conv2d"
    keys: ClassVar[tuple[str, ...]] = ("n", "c", "h", "w", "k", "r", "s")
    options = {"stride": 1, "pad": 0, "dilation": 1}
    anchor = "conv"
    description = "NCHW convolution, weight KCRS"

    def out_hw(self, p):
        return (
            conv_out(p["h"], p["r"], p["stride"], p["pad"], p["dilation"]),
            conv_out(p["w"], p["s"], p["stride"], p["pad"], p["dilation"]),
        )

    def check(self, p):
        positive(p, *self.keys, "stride", "dilation")
        if not isinstance(p["pad"], int) or p["pad"] < 0:
            raise WorkloadError(f"key 'pad' must be a non-negative integer, got {p['pad']!r}")
        if min(self.out_hw(p)) <= 0:
            raise WorkloadError(f"{self.name}: kernel larger than padded input ({p})")

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["h"], p["w"]), (p["k"], p["c"], p["r"], p["s"])]

    def output_shape(self, p):
        return (p["n"], p["k"], *self.out_hw(p))

    def axes(self, p):
        oh, ow = self.out_hw(p)
        return [
            Axis("n", p["n"]), Axis("f", p["k"]), Axis("y", oh), Axis("x", ow),
            Axis("rc", p["c"], True), Axis("ry", p["r"], True), Axis("rx", p["s"], True),
        ]

    def flops(self, p):
        return 2.0 * math.prod(self.output_shape(p)) * p["c"] * p["r"] * p["s"]

    def define(self, p, dtype):
        from tvm import te

        data = te.placeholder(self.input_shapes(p)[0], dtype, name="data")
        weight = te.placeholder(self.input_shapes(p)[1], dtype, name="weight")
        padded = _pad(data, p["pad"], 0.0)
        rc = te.reduce_axis((0, p["c"]), name="rc")
        ry = te.reduce_axis((0, p["r"]), name="ry")
        rx = te.reduce_axis((0, p["s"]), name="rx")
        st, dil = p["stride"], p["dilation"]
        out = te.compute(
            self.output_shape(p),
            lambda n, f, y, x: te.sum(
                padded[n, rc, y * st + ry * dil, x * st + rx * dil] * weight[f, rc, ry, rx], axis=[rc, ry, rx]
            ),
            name="conv",
        )
        return [data, weight, out]

    def torch_impl(self, p):
        F = _F()
        return lambda x, w: F.conv2d(x, w, stride=p["stride"], padding=p["pad"], dilation=p["dilation"])


class DepthwiseConv2d(Conv2d):
    name = "depthwise_conv2d"
    keys = ("n", "c", "h", "w", "r", "s")
    description = "NCHW depthwise convolution (multiplier 1), weight CRS"

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["h"], p["w"]), (p["c"], p["r"], p["s"])]

    def output_shape(self, p):
        return (p["n"], p["c"], *self.out_hw(p))

    def axes(self, p):
        oh, ow = self.out_hw(p)
        return [
            Axis("n", p["n"]), Axis("c", p["c"]), Axis("y", oh), Axis("x", ow),
            Axis("ry", p["r"], True), Axis("rx", p["s"], True),
        ]

    def flops(self, p):
        return 2.0 * math.prod(self.output_shape(p)) * p["r"] * p["s"]

    def define(self, p, dtype):
        from tvm import te

        data = te.placeholder(self.input_shapes(p)[0], dtype, name="data")
        weight = te.placeholder(self.input_shapes(p)[1], dtype, name="weight")
        padded = _pad(data, p["pad"], 0.0)
        ry = te.reduce_axis((0, p["r"]), name="ry")
        rx = te.reduce_axis((0, p["s"]), name="rx")
        st, dil = p["stride"], p["dilation"]
        out = te.compute(
            self.output_shape(p),
            lambda n, c, y, x: te.sum(
                padded[n, c, y * st + ry * dil, x * st + rx * dil] * weight[c, ry, rx], axis=[ry, rx]
            ),
            name="conv",
        )
        return [data, weight, out]

    def torch_impl(self, p):
        F = _F()
        return lambda x, w: F.conv2d(x, w.unsqueeze(1), stride=p["stride"], padding=p["pad"],
                                     dilation=p["dilation"], groups=p["c"])


class Pool2d(DepthwiseConv2d):
    name = "pool2d"
    options = {"stride": 1, "pad": 0, "dilation": 1, "kind": "max"}
    anchor = "pool"
    description = "NCHW max or average pooling (average counts padding)"

    def check(self, p):
        super().check(p)
        if p["kind"] not in ("max", "avg"):
            raise WorkloadError(f"key 'kind' must be 'max' or 'avg', got {p['kind']!r}")

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["h"], p["w"])]

    def flops(self, p):
        return float(math.prod(self.output_shape(p)) * p["r"] * p["s"])

    def define(self, p, dtype):
        from tvm import te

        data = te.placeholder(self.input_shapes(p)[0], dtype, name="data")
        is_max = p["kind"] == "max"
        padded = _pad(data, p["pad"], te.min_value(dtype) if is_max else 0.0)
        ry = te.reduce_axis((0, p["r"]), name="ry")
        rx = te.reduce_axis((0, p["s"]), name="rx")
        st, dil = p["stride"], p["dilation"]
        reducer = te.max if is_max else te.sum
        out = te.compute(
            self.output_shape(p),
            lambda n, c, y, x: reducer(padded[n, c, y * st + ry * dil, x * st + rx * dil], axis=[ry, rx]),
            name="pool",
        )
        if not is_max:
            area = float(p["r"] * p["s"])
            out = te.compute(self.output_shape(p), lambda *i: out(*i) / area, name="pool_avg")
        return [data, out]

    def torch_impl(self, p):
        F = _F()
        window = (p["r"], p["s"])
        if p["kind"] == "max":
            return lambda x: F.max_pool2d(x, window, stride=p["stride"], padding=p["pad"], dilation=p["dilation"])
        if p["dilation"] != 1:
            raise WorkloadError("pool2d: average pooling has no dilated reference")
        return lambda x: F.avg_pool2d(x, window, stride=p["stride"], padding=p["pad"], count_include_pad=True)


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


OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (
        MatMul(), BatchMatMul(), Dense(), Conv2d(), DepthwiseConv2d(), Pool2d(), Softmax(), LayerNorm(), AddRelu(),
        Fused(),
    )
}

def parse_value(text: str) -> Any:
    """Integers stay integers; anything else (``kind=max``) stays a string."""
    try:
        return int(text)
    except ValueError:
        return text
