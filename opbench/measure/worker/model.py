"""A whole model timed in a kernel worker: its Relax VM library loaded, checked once, and a series timed; or
profiled call by call."""
from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

from opbench.measure.protocol import ModelInput, ModelProfileInput, RunResult
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


def profile_model(req: ModelProfileInput, prepacked_suffix: str = "_prepacked") -> RunResult:
    """ms a model run of each function the built model calls (a prepacked operator's under its own name), over
    ``req.runs`` runs after one warm-up, timed by the Relax VM's instrumentation (each call's time includes a
    few microseconds of the instrumentation's own); ``latencies_s`` holds each run's time."""
    import tvm
    from tvm import relax

    start = time.perf_counter()
    vm = relax.VirtualMachine(tvm.runtime.load_module(req.library), tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in saved_inputs(req.inputs)[0]]
    total_s: dict[str, float] = defaultdict(float)
    started: dict[str, float] = {}

    def instrument(func: Any, name: str, before: bool, result: Any, *call_args: Any) -> int:
        if before:
            started[name] = time.perf_counter()
        else:
            total_s[name.removesuffix(prepacked_suffix)] += time.perf_counter() - started[name]
        return 0  # carry on with the call

    vm["main"](*args)
    vm.set_instrument(instrument)
    runs = []
    for _ in range(req.runs):
        tick = time.perf_counter()
        vm["main"](*args)
        runs.append(time.perf_counter() - tick)
    return RunResult(Status.OK, latencies_s=runs, number=1, run_s=time.perf_counter() - start, pid=os.getpid(),
                     op_ms={name: seconds * 1e3 / req.runs for name, seconds in total_s.items()})
