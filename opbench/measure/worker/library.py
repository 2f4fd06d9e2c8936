"""The library worker: times library baselines (torch, numpy; ONNX Runtime for int8) in a process that never
imports TVM, on the CPU or, for a GPU target, torch on the GPU (docs/measurement.md#gpu)."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opbench.measure.protocol import ONNXRUNTIME, LibraryInput, ModelInput, RunResult
from opbench.measure.timing import TimingPolicy
from opbench.measure.worker._common import FLUSH_BYTES, Inputs, check_output, time_series
from opbench.measure.worker.frameworks import model_call
from opbench.measure.worker.onnx_int8 import ONNX_NODES, int8_call
from opbench.record import MEM_PREFIX, Status
from opbench.workloads import BF16, numpy_dtype

TORCH_ALLOCATED = f"{MEM_PREFIX}torch_allocated"  # what PyTorch's profiler says its operators allocate in one call


def torch_allocated(call: Callable[[], None], gpu: bool = False) -> float:
    """Bytes PyTorch allocates for one ``call`` (its output included): on a GPU, the caching allocator's peak
    above what was held before; on the CPU, what its profiler records for the call's operators
    (allocations a library below PyTorch makes for itself, such as oneDNN's scratchpad, are not seen)."""
    import torch

    if gpu:
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - held)
    from torch.autograd import profiler

    with profiler.profile(profile_memory=True, use_kineto=False) as trace:
        call()
    return float(sum(max(event.self_cpu_memory_usage, 0) for event in trace.key_averages() if event.key != "[memory]"))


def as_torch(array: np.ndarray) -> Any:
    """``array`` as a torch tensor sharing its memory (ml_dtypes' bfloat16 as torch's)."""
    import torch

    if array.dtype == numpy_dtype(BF16):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def torch_device(target: str) -> tuple[Any, Callable[[], None]]:
    """The torch device for ``target`` and what waits for its queued work (nothing on the CPU). On a GPU,
    float32 stays float32: TF32 is off for matmuls and convolutions, as TVM's kernels compute in full fp32."""
    import torch

    from opbench.hardware.targets import is_gpu

    if not is_gpu(target):
        return torch.device("cpu"), lambda: None
    if not torch.cuda.is_available():
        raise RuntimeError(f"target {target}: this torch ({torch.__version__}) sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda"), torch.cuda.synchronize


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
        from opbench.workloads import INT8, parse_workload

        start = time.perf_counter()
        workload = parse_workload(req.workload)
        arrays = self._inputs_for(req.workload)[0]
        if req.library == "torch":
            import torch

            torch.set_num_threads(self._threads)
            device, sync = torch_device(req.resources.target)
            fn, tensors = workload.op.torch_impl(workload.params), [as_torch(a).to(device) for a in arrays]
            torch.set_grad_enabled(False)

            def call() -> None:
                fn(*tensors)

            result = self._time(req.timing, call, start, sync)
            result.memory = {TORCH_ALLOCATED: torch_allocated(call, device.type == "cuda")}
            return result
        if req.library == ONNXRUNTIME and workload.op.name in ONNX_NODES and workload.dtype == INT8:
            call = int8_call(workload, arrays, self._threads)
            got, expected = call(), workload.reference(arrays)
            if not np.array_equal(got, expected):
                err = float(np.max(np.abs(got.astype("float64") - expected)))
                return RunResult(Status.WRONG_RESULT, f"{workload.name}: ONNX Runtime's output differs from the exact "
                                                      f"integer product: max |err| = {err:.6g}", max_abs_err=err)
            return self._time(req.timing, call, start)
        if req.library == "numpy" and workload.op.numpy_impl:
            def call() -> None:
                workload.op.reference(arrays, workload.params)
            return self._time(req.timing, call, start)
        return RunResult(Status.RUN_ERROR, f"no {req.library} implementation of {workload.op.name}")

    def model(self, req: ModelInput) -> RunResult:
        """A whole model as PyTorch eager (the catalogue model), torch.compile or ONNX Runtime run it
        (:func:`~opbench.measure.worker.frameworks.model_call`), under ``no_grad``, its output checked first."""
        import torch

        start = time.perf_counter()
        torch.set_num_threads(self._threads)
        torch.set_grad_enabled(False)
        device, sync = torch_device(req.resources.target)
        try:
            call, expected = model_call(req, self._threads, device)
        except (ValueError, ImportError) as exc:
            return RunResult(Status.RUN_ERROR, str(exc))
        err, wrong = check_output(req.model, call(), expected)
        if wrong is not None:
            return wrong
        result = self._time(req.timing, call, start, sync)
        result.max_abs_err = err
        return result

    def _time(self, timing: TimingPolicy, call: Callable[[], None], start: float,
              sync: Callable[[], None] = lambda: None) -> RunResult:
        """One series of ``call`` as ``timing`` shapes it (the caches flushed before each repeat with
        ``cache_flush``), after a first call that warms it up; ``sync`` waits for the work a
        repeat queued (a GPU's), inside its time, as TVM's time_evaluator does."""
        if timing.cache_flush and self._flush is None:
            self._flush = np.zeros(FLUSH_BYTES // 8)
        first = time.perf_counter()
        call()
        sync()
        first = time.perf_counter() - first

        def evaluate(number: int, repeat: int) -> list[float]:
            latencies = []
            for _ in range(repeat):
                if self._flush is not None:
                    self._flush += 1.0  # writes every line: the inputs are evicted
                tick = time.perf_counter()
                for _ in range(number):
                    call()
                sync()
                latencies.append((time.perf_counter() - tick) / number)
            return latencies

        latencies, number, load = time_series(timing, first, call, evaluate)
        return RunResult(Status.OK, latencies_s=latencies, number=number, run_s=time.perf_counter() - start,
                         load=load, pid=os.getpid())
