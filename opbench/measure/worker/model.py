"""A whole model timed in a kernel worker: its Relax VM library loaded, checked once, and a series timed."""
from __future__ import annotations

import os
import time

from opbench.measure.protocol import ModelInput, RunResult
from opbench.measure.worker._common import check_output, saved_inputs, time_series
from opbench.record import Status


def time_model(req: ModelInput) -> RunResult:
    """Load the model's library and inputs, run it once (checking its first output against the saved
    reference, when there is one) and time a series of runs."""
    import tvm
    from tvm import relax

    from opbench.hardware.targets import is_gpu

    start = time.perf_counter()
    dev = tvm.cuda(0) if is_gpu(req.resources.target) else tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(req.library), dev)
    arrays, expected = saved_inputs(req.inputs)
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    first = time.perf_counter()
    out = vm["main"](*args)
    first = time.perf_counter() - first
    vm.set_input("main", *args)
    err, wrong = check_output(req.model, out, expected)
    if wrong is not None:
        wrong.run_s = time.perf_counter() - start
        return wrong

    def evaluate(number: int, repeat: int) -> list[float]:
        return list(vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat)("main").results)

    latencies, number, load = time_series(req.timing, first, lambda: vm.invoke_stateful("main"), evaluate)
    return RunResult(Status.OK, latencies_s=latencies, number=number, run_s=time.perf_counter() - start,
                     max_abs_err=err, load=load, pid=os.getpid())
