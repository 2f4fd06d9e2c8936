"""Calibration for static int8: the range of each matrix product's and convolution's activations over sample
inputs, as ONNX Runtime's ``quantize_static`` and OpenVINO's NNCF take them (min and max, per tensor).

The fp32 module runs with each product's activation passed through an opaque kernel of its own (named by the
product's site, :func:`site`) that copies it and writes its range; the Relax VM's instrument reads the range. The module is built
with TVM's own lowering (no schedules: calibration runs once per model import, on a few samples).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

OBSERVED = "observed_"  # the name prefix of a site's copy kernel; the site's key follows
SAMPLES = 4  # calibration inputs drawn like the example inputs
Ranges = dict[str, tuple[float, float]]  # a product's site -> its activation's (min, max) over the samples


def site(weight: np.ndarray) -> str:
    """A product's key: its constant fp32 weight's digest (two products of one weight share their calibration)."""
    return hashlib.sha1(np.ascontiguousarray(weight).tobytes()).hexdigest()[:16]


def samples(example: list[np.ndarray], count: int = SAMPLES, seed: int = 0) -> list[list[np.ndarray]]:
    """``count`` inputs drawn like ``example``: each float array normal with its mean and standard deviation; other
    arrays (token ids, masks) kept."""
    rng = np.random.default_rng(seed)

    def like(a: np.ndarray) -> np.ndarray:
        if not np.issubdtype(a.dtype, np.floating):
            return a
        return (rng.standard_normal(a.shape) * a.std() + a.mean()).astype(a.dtype)

    return [[like(a) for a in example] for _ in range(count)]


def activation_ranges(mod: Any, products: Callable[[Any, Callable[[Any, Any, np.ndarray], Any]], Any],
                      inputs: list[list[np.ndarray]]) -> Ranges:
    """The activation range of every product ``products(mod, rewrite)`` visits (``rewrite(call, x, weight)`` may
    replace the call), over ``inputs`` (lists of ``mod``'s main's arguments), from the fp32 ``mod`` itself."""
    import tvm
    from tvm import relax

    kernels = relax.BlockBuilder()

    def observed(call: Any, x: Any, weight: np.ndarray) -> Any:
        if str(x.ty.dtype) != "float32":  # never quantized
            return call
        key = site(weight)
        shape = [int(d) for d in x.ty.shape]
        size = int(np.prod(shape))
        kernel = kernels.add_func(_observe(size).with_attr("opbench.site", key), OBSERVED + key)  # one per site
        observe = relax.call_tir(kernel, [relax.op.reshape(x, (size,))],
                                 [relax.TensorType((size,), "float32"), relax.TensorType((2,), "float32")])
        return relax.Call(call.op, [relax.op.reshape(relax.TupleGetItem(observe, 0), shape), *call.args[1:]],
                          call.attrs)

    calibrated = products(mod, observed)
    for gvar, kernel in kernels.get().functions.items():
        calibrated[gvar] = kernel
    vm = relax.VirtualMachine(tvm.compile(calibrated, target="llvm"), tvm.cpu())
    ranges: Ranges = {}

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if not before and symbol.startswith(OBSERVED):
            (low, high), key = args[2].numpy(), symbol.removeprefix(OBSERVED)
            known = ranges.get(key, (0.0, 0.0))
            ranges[key] = (min(known[0], float(low)), max(known[1], float(high)))
        return 0  # relax.VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    for arrays in inputs:
        vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return ranges


def _observe(n: int) -> Any:
    """An opaque kernel copying ``n`` float32 values and writing their range (min, max, zero included): never fused,
    nor taken for a reshape (its second output), so the instrument sees each call."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def kernel(x: T.Buffer((n,), "float32"), y: T.Buffer((n,), "float32"),  # type: ignore[valid-type]
               extent: T.Buffer((2,), "float32")) -> None:  # type: ignore[valid-type]
        T.func_attr({"s_tir": True, "tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        with T.sblock("root"):
            extent[0] = T.float32(0)
            extent[1] = T.float32(0)
            for i in range(n):
                y[i] = x[i]
                extent[0] = T.min(extent[0], x[i])
                extent[1] = T.max(extent[1], x[i])

    return kernel.without_attr("global_symbol")
