"""A whole model timed in a kernel worker: its Relax VM library loaded, checked once, and a series timed."""
from __future__ import annotations

import math
import os
import time

from opbench.measure.protocol import ModelInput, RunResult
from opbench.measure.worker._common import EXPECTED, time_series
from opbench.record import Status


def time_model(req: ModelInput) -> RunResult:
    """Load the model's library and inputs, run it once (checking its first output against the saved
    reference, when there is one) and time a series of runs."""
    import numpy as np
    import tvm
    from tvm import relax

    from opbench.hardware.targets import is_gpu

    start = time.perf_counter()
    dev = tvm.cuda(0) if is_gpu(req.resources.target) else tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(req.library), dev)
    with np.load(req.inputs) as saved:
        arrays = {name: saved[name] for name in saved.files}
    expected = arrays.pop(EXPECTED, None)
    args = [tvm.runtime.tensor(arrays[f"arg{i}"], dev) for i in range(len(arrays))]
    first = time.perf_counter()
    out = vm["main"](*args)
    first = time.perf_counter() - first
    vm.set_input("main", *args)
    err = math.nan
    if expected is not None:
        got = (out[0] if isinstance(out, (list, tuple, tvm.ir.Array)) else out).numpy()
        err = float(np.max(np.abs(got - expected)))
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-3):
            return RunResult(Status.WRONG_RESULT, f"{req.model}: output differs from the reference: max |err| = {err:.3g}",
                             max_abs_err=err, run_s=time.perf_counter() - start)

    def evaluate(number: int, repeat: int) -> list[float]:
        return list(vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat)("main").results)

    latencies, number, load = time_series(req.timing, first, lambda: vm.invoke_stateful("main"), evaluate)
    return RunResult(Status.OK, latencies_s=latencies, number=number, run_s=time.perf_counter() - start,
                     max_abs_err=err, load=load, pid=os.getpid())
