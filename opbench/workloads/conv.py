"""Windowed operators: conv2d, depthwise_conv2d and pool2d (NCHW), and the padding stage of every convolution."""
from __future__ import annotations

import math
from typing import ClassVar

from opbench.exceptions import WorkloadError
from opbench.workloads._base import FLOAT_DTYPES, LOW_PRECISION, Axis, Operator, conv_out, non_negative, positive, widen
from opbench.workloads._torch import functional as _F


def pad_spatial(data, pad: int, value):
    """A padding stage named ``pad`` of every dimension after batch and channels (NCHW, NCDHW); identity when
    pad == 0."""
    from tvm import te, tirx

    if pad == 0:
        return data
    n, c, *spatial = data.shape

    def body(nn, cc, *at):
        inside = tirx.all(*(i >= pad for i in at), *(i < size + pad for i, size in zip(at, spatial)))
        return tirx.if_then_else(inside, data[(nn, cc, *(i - pad for i in at))], value)

    return te.compute((n, c, *(size + 2 * pad for size in spatial)), body, name="pad")


class Conv2d(Operator):
    name = "conv2d"
    keys: ClassVar[tuple[str, ...]] = ("n", "c", "h", "w", "k", "r", "s")
    options = {"stride": 1, "pad": 0, "dilation": 1}
    anchor = "conv"
    description = "NCHW convolution, weight KCRS"
    dtypes: ClassVar[tuple[str, ...]] = (*FLOAT_DTYPES, *LOW_PRECISION)

    def out_spatial(self, p):
        return (
            conv_out(p["h"], p["r"], p["stride"], p["pad"], p["dilation"]),
            conv_out(p["w"], p["s"], p["stride"], p["pad"], p["dilation"]),
        )

    def check(self, p):
        positive(p, *self.keys, "stride", "dilation")
        non_negative(p, "pad")
        if min(self.out_spatial(p)) <= 0:
            raise WorkloadError(f"{self.name}: kernel larger than padded input ({p})")

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["h"], p["w"]), (p["k"], p["c"], p["r"], p["s"])]

    def output_shape(self, p):
        return (p["n"], p["k"], *self.out_spatial(p))

    def axes(self, p):
        oh, ow = self.out_spatial(p)
        return [
            Axis("n", p["n"]), Axis("f", p["k"]), Axis("y", oh), Axis("x", ow),
            Axis("rc", p["c"], True), Axis("ry", p["r"], True), Axis("rx", p["s"], True),
        ]

    def flops(self, p):
        return 2.0 * math.prod(self.output_shape(p)) * p["c"] * p["r"] * p["s"]

    def define(self, p, dtype):
        from tvm import te, tirx

        (data_type, weight_type), acc = self.input_dtypes(p, dtype), self.output_dtype(p, dtype)
        data = te.placeholder(self.input_shapes(p)[0], data_type, name="data")
        weight = te.placeholder(self.input_shapes(p)[1], weight_type, name="weight")
        padded = pad_spatial(data, p["pad"], tirx.const(0, data_type))
        rc = te.reduce_axis((0, p["c"]), name="rc")
        ry = te.reduce_axis((0, p["r"]), name="ry")
        rx = te.reduce_axis((0, p["s"]), name="rx")
        st, dil = p["stride"], p["dilation"]
        out = te.compute(
            self.output_shape(p),
            lambda n, f, y, x: te.sum(
                widen(padded[n, rc, y * st + ry * dil, x * st + rx * dil], acc) * widen(weight[f, rc, ry, rx], acc),
                axis=[rc, ry, rx]
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
    dtypes = FLOAT_DTYPES

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["h"], p["w"]), (p["c"], p["r"], p["s"])]

    def output_shape(self, p):
        return (p["n"], p["c"], *self.out_spatial(p))

    def axes(self, p):
        oh, ow = self.out_spatial(p)
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
        padded = pad_spatial(data, p["pad"], 0.0)
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
        padded = pad_spatial(data, p["pad"], te.min_value(dtype) if is_max else 0.0)
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
