"""conv3d: a 3-D convolution (NCDHW), as in video and volumetric CNNs (ResNet3D)."""
from __future__ import annotations

import math
from typing import ClassVar

from opbench.workloads._base import FLOAT_DTYPES, Axis, conv_out
from opbench.workloads._torch import functional as _F
from opbench.workloads.conv import Conv2d, pad_spatial


class Conv3d(Conv2d):
    name = "conv3d"
    keys: ClassVar[tuple[str, ...]] = ("n", "c", "d", "h", "w", "k", "t", "r", "s")
    description = "NCDHW 3-D convolution, weight KCTRS (the same stride, padding and dilation in each dimension)"
    dtypes = FLOAT_DTYPES

    def out_spatial(self, p):  # depth, height and width
        window = (("d", "t"), ("h", "r"), ("w", "s"))
        return tuple(conv_out(p[size], p[kernel], p["stride"], p["pad"], p["dilation"]) for size, kernel in window)

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["d"], p["h"], p["w"]), (p["k"], p["c"], p["t"], p["r"], p["s"])]

    def output_shape(self, p):
        return (p["n"], p["k"], *self.out_spatial(p))

    def axes(self, p):
        od, oh, ow = self.out_spatial(p)
        return [Axis("n", p["n"]), Axis("f", p["k"]), Axis("z", od), Axis("y", oh), Axis("x", ow),
                Axis("rc", p["c"], True), Axis("rz", p["t"], True), Axis("ry", p["r"], True), Axis("rx", p["s"], True)]

    def flops(self, p):
        return 2.0 * math.prod(self.output_shape(p)) * p["c"] * p["t"] * p["r"] * p["s"]

    def define(self, p, dtype):
        from tvm import te

        data = te.placeholder(self.input_shapes(p)[0], dtype, name="data")
        weight = te.placeholder(self.input_shapes(p)[1], dtype, name="weight")
        padded = pad_spatial(data, p["pad"], 0.0)
        rc, rz, ry, rx = (te.reduce_axis((0, p[key]), name=name) for key, name in
                          (("c", "rc"), ("t", "rz"), ("r", "ry"), ("s", "rx")))
        st, dil = p["stride"], p["dilation"]
        out = te.compute(
            self.output_shape(p),
            lambda n, f, z, y, x: te.sum(
                padded[n, rc, z * st + rz * dil, y * st + ry * dil, x * st + rx * dil] * weight[f, rc, rz, ry, rx],
                axis=[rc, rz, ry, rx]),
            name="conv",
        )
        return [data, weight, out]

    def torch_impl(self, p):
        F = _F()
        return lambda x, w: F.conv3d(x, w, stride=p["stride"], padding=p["pad"], dilation=p["dilation"])
