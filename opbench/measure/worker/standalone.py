"""Kernels a kernel worker builds and times itself, without a catalogue workload or a reference to check:
the host's peak kernel (:mod:`opbench.hardware.peak`) and a model's operator given as TVMScript. Each is built
in the worker, once for a job's placements (they come in a row with the same request: a placement costs a fork,
not a compile); the returned call times one placement of it."""
from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any

from opbench.measure.protocol import PeakInput, PrimFuncInput, RunResult
from opbench.measure.timing import TimingPolicy
from opbench.measure.worker._common import COLD, time_series
from opbench.record import Status


@functools.lru_cache(maxsize=1)
def peak_timer(req: PeakInput, pool_here: Callable[[], None]) -> Callable[[], RunResult]:
    """The peak kernel of ``req``'s threads and dtype, built now."""
    import numpy as np
    import tvm

    from opbench.hardware.resources import host_facts
    from opbench.hardware.targets import make_target
    from opbench.space.peak_units import peak_of

    peak = peak_of(req.dtype, host_facts().isa, req.resources.threads)
    if peak is None:
        raise ValueError(f"no peak of {req.dtype} is measured on this CPU")
    module = tvm.compile(tvm.IRModule({"main": peak.build()}), make_target("llvm", req.resources.threads)).mod
    return _timer(module, lambda: [tvm.runtime.tensor(np.ones(peak.shape, peak.dtype)) for _ in range(2)],
                  req.timing, pool_here)


@functools.lru_cache(maxsize=1)
def primfunc_timer(req: PrimFuncInput, pool_here: Callable[[], None]) -> Callable[[], RunResult]:
    """``req``'s PrimFunc compiled alone for its target (a TVM target's JSON, or a name such as ``llvm``), called
    on random inputs (booleans 0 or 1, other integers 0: an index valid in any dimension)."""
    import numpy as np
    import tvm

    from opbench.hardware.targets import make_target

    func = tvm.script.from_source(req.script)
    target = tvm.target.Target(json.loads(req.target)) if req.target.startswith("{") else \
        make_target(req.target, req.resources.threads)
    module = tvm.compile(tvm.IRModule({"main": func}), target).mod

    def arguments() -> list[Any]:
        rng = np.random.default_rng(0)
        out = []
        for buffer in func.params:
            shape = [int(d) for d in buffer.shape]
            dtype = str(buffer.dtype)
            data = rng.standard_normal(shape) if "float" in dtype else rng.integers(0, 2 if dtype == "bool" else 1, shape)
            out.append(tvm.runtime.tensor(data.astype(dtype)))
        return out

    return _timer(module, arguments, req.timing, pool_here)


def _timer(module: Any, arguments: Callable[[], list[Any]], timing: TimingPolicy,
           pool_here: Callable[[], None]) -> Callable[[], RunResult]:
    import tvm

    main, device = module["main"], tvm.cpu(0)  # LLVM's JIT compiles it here, once: each placement's child has it

    def timed() -> RunResult:
        pool_here()
        args = arguments()  # in the placement's own process: its own buffers and pages
        tick = time.perf_counter()
        main(*args)
        first_s = time.perf_counter() - tick

        def evaluate(number: int, repeat: int) -> list[float]:
            cold = COLD if timing.cache_flush else ""
            return list(module.time_evaluator("main", device, number=number, repeat=repeat, f_preproc=cold)(*args).results)

        latencies, number, load = time_series(timing, first_s, lambda: main(*args), evaluate)
        return RunResult(Status.OK, latencies_s=latencies, number=number, load=load, pid=os.getpid())

    return timed
