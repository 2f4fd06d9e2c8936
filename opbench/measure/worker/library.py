"""The library worker: times library baselines (torch, numpy) in a process that never imports TVM."""
from __future__ import annotations

import os
import time
from typing import Any

from opbench.hardware.quiet import HostLoad
from opbench.measure.protocol import LibraryInput, RunResult
from opbench.measure.worker._common import FLUSH_BYTES, Inputs
from opbench.record import Status


class LibraryWorker:
    """Times library baselines (torch, numpy) with the worker's threads and cores. It never imports
    TVM, so no TVM kernel or thread pool ever runs in its process."""

    def __init__(self, cores: tuple[int, ...] | None, threads: int) -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        self._threads = threads
        self._inputs_for = Inputs()
        self._flush: Any = None

    def library(self, req: LibraryInput) -> RunResult:
        import numpy as np

        from opbench.workloads import parse_workload

        start = time.perf_counter()
        workload = parse_workload(req.workload)
        arrays = self._inputs_for(req.workload)[0]
        if req.library == "torch":
            import torch

            torch.set_num_threads(self._threads)
            fn, tensors = workload.op.torch_impl(workload.params), [torch.from_numpy(a) for a in arrays]
            torch.set_grad_enabled(False)

            def call() -> None:
                fn(*tensors)
        elif req.library == "numpy" and workload.op.numpy_impl:
            def call() -> None:
                workload.op.reference(arrays, workload.params)
        else:
            return RunResult(Status.RUN_ERROR, f"no {req.library} implementation of {workload.op.name}")
        timing = req.timing
        if timing.cache_flush and self._flush is None:
            self._flush = np.zeros(FLUSH_BYTES // 8)
        first = time.perf_counter()
        call()
        number, repeat = timing.series_shape(time.perf_counter() - first, call)
        load = HostLoad()
        load.start()
        latencies = []
        for _ in range(repeat + 1):  # the first repeat, warming up, is dropped
            if self._flush is not None:
                self._flush += 1.0  # writes every line: the inputs are evicted
            tick = time.perf_counter()
            for _ in range(number):
                call()
            latencies.append((time.perf_counter() - tick) / number)
        return RunResult(Status.OK, latencies_s=latencies[1:], number=number, run_s=time.perf_counter() - start,
                         load=load.stop(), pid=os.getpid())
