"""The host's peak kernel (:mod:`opbench.hardware.peak`) built and timed in a kernel worker."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from opbench.measure.protocol import PeakInput, RunResult
from opbench.measure.worker._common import time_series
from opbench.record import Status


def peak_timer(req: PeakInput, pool_here: Callable[[], None]) -> Callable[[], RunResult]:
    """Build the peak kernel for ``req`` now; the returned call times one placement of it (``pool_here`` sizes the
    calling process's thread pool first)."""
    import numpy as np
    import tvm

    from opbench.hardware.peak import CHAINS, peak_kernel, vector_lanes
    from opbench.hardware.resources import host_facts
    from opbench.hardware.targets import make_target

    threads, lanes = req.resources.threads, vector_lanes(host_facts().isa, req.dtype)
    module = tvm.compile(tvm.IRModule({"main": peak_kernel(threads, lanes, req.dtype)}), make_target("llvm", threads)).mod

    def timed() -> RunResult:
        pool_here()
        args = [tvm.runtime.tensor(np.ones((threads, CHAINS, lanes), req.dtype)) for _ in range(2)]
        main, device = module["main"], tvm.cpu(0)
        tick = time.perf_counter()
        main(*args)
        first_s = time.perf_counter() - tick

        def evaluate(number: int, repeat: int) -> list[float]:
            return list(module.time_evaluator("main", device, number=number, repeat=repeat)(*args).results)

        latencies, number, load = time_series(req.timing, first_s, lambda: main(*args), evaluate)
        return RunResult(Status.OK, latencies_s=latencies, number=number, load=load, pid=os.getpid())

    return timed
