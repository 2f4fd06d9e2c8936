"""conv2d_transpose: a transposed (fractionally strided) convolution, NCHW, as in DCGAN's generator and
decoders: the input spread ``stride`` apart and padded (one stage, ``pad``), then a stride-1 convolution with
the kernel flipped."""
from __future__ import annotations

import math
from typing import ClassVar

from opbench.exceptions import WorkloadError
from opbench.workloads._base import FLOAT_DTYPES, non_negative, positive
from opbench.workloads._torch import functional as _F
from opbench.workloads.conv import Conv2d


class Conv2dTranspose(Conv2d):
    """A conv2d's loops (n, f, y, x | rc, ry, rx) over the spread input; its own shapes, checks and FLOPs."""

    name = "conv2d_transpose"
    keys: ClassVar[tuple[str, ...]] = ("n", "c", "h", "w", "k", "r", "s")
    options = {"stride": 1, "pad": 0, "output_padding": 0}
    description = "NCHW transposed convolution, weight CKRS (PyTorch's layout); FLOPs count the products of real inputs"
    dtypes = FLOAT_DTYPES

    def out_spatial(self, p):
        return tuple((p[size] - 1) * p["stride"] - 2 * p["pad"] + p[kernel] + p["output_padding"]
                     for size, kernel in (("h", "r"), ("w", "s")))

    def check(self, p):
        positive(p, *self.keys, "stride")
        non_negative(p, "pad", "output_padding")
        if p["pad"] > min(p["r"], p["s"]) - 1:
            raise WorkloadError(f"{self.name}: pad {p['pad']} must be below the kernel ({p['r']}x{p['s']})")
        if p["output_padding"] >= p["stride"]:
            raise WorkloadError(f"{self.name}: output_padding {p['output_padding']} must be below stride {p['stride']}")

    def input_shapes(self, p):
        return [(p["n"], p["c"], p["h"], p["w"]), (p["c"], p["k"], p["r"], p["s"])]

    def flops(self, p):
        """Each input pixel times each weight: the zeros the spread-out input holds are not counted."""
        return 2.0 * math.prod(self.input_shapes(p)[0]) * p["k"] * p["r"] * p["s"]

    def has_pad_stage(self, p):
        return True  # the spread-out input is a stage of its own, padded or not

    def define(self, p, dtype):
        from tvm import te, tirx

        data = te.placeholder(self.input_shapes(p)[0], dtype, name="data")
        weight = te.placeholder(self.input_shapes(p)[1], dtype, name="weight")
        st, (oh, ow) = p["stride"], self.out_spatial(p)
        before = (p["r"] - 1 - p["pad"], p["s"] - 1 - p["pad"])
        spread = ((p["h"] - 1) * st + 1, (p["w"] - 1) * st + 1)

        def body(n, c, yy, xx):
            y, x = yy - before[0], xx - before[1]
            on_input = tirx.all(y >= 0, x >= 0, y < spread[0], x < spread[1], y % st == 0, x % st == 0)
            return tirx.if_then_else(on_input, data[n, c, y // st, x // st], tirx.const(0.0, dtype))

        padded = te.compute((p["n"], p["c"], oh + p["r"] - 1, ow + p["s"] - 1), body, name="pad")
        rc, ry, rx = (te.reduce_axis((0, p[key]), name=name) for key, name in (("c", "rc"), ("r", "ry"), ("s", "rx")))
        out = te.compute(
            self.output_shape(p),
            lambda n, f, y, x: te.sum(padded[n, rc, y + ry, x + rx] * weight[rc, f, p["r"] - 1 - ry, p["s"] - 1 - rx],
                                      axis=[rc, ry, rx]),
            name="conv",
        )
        return [data, weight, out]

    def torch_impl(self, p):
        F = _F()
        return lambda x, w: F.conv_transpose2d(x, w, stride=p["stride"], padding=p["pad"],
                                               output_padding=p["output_padding"])
