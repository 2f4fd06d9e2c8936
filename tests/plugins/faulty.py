"""A test plugin (loaded through OPBENCH_PLUGINS): an operator whose kernel misbehaves on demand.

mode=0 computes 2*A correctly; mode=1 calls abort() (its process dies); mode=2 sleeps for an hour
(the run times out); mode=3 is correct code checked against a wrong reference (wrong_result).
"""
from __future__ import annotations

from opbench.plugins import register
from opbench.space.rowwise import RowwiseTemplate
from opbench.workloads import Axis, Operator

MODES = {0: None, 1: ("abort",), 2: ("sleep", 3600)}


class Faulty(Operator):
    name = "faulty"
    keys = ("n",)
    options = {"mode": 0}
    anchor = "C"
    description = "test-only: 2*A, or a kernel that crashes / hangs / is checked wrongly"

    def input_shapes(self, p):
        return [(p["n"],)]

    def output_shape(self, p):
        return (p["n"],)

    def axes(self, p):
        return [Axis("i", p["n"])]

    def flops(self, p):
        return float(p["n"])

    def define(self, p, dtype):
        from tvm import te, tirx

        a = te.placeholder((p["n"],), dtype, name="A")
        call = MODES.get(p["mode"])

        def body(i):
            value = a[i] * 2.0
            if call:
                value = value + tirx.call_extern(dtype, *call)  # never returns in time
            return value

        return [a, te.compute((p["n"],), body, name="C")]

    def torch_impl(self, p):
        return lambda a: a * (3.0 if p["mode"] == 3 else 2.0)


register(Faulty(), RowwiseTemplate("faulty", fuse_all=True))
