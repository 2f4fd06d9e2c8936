"""The body of a worker process: imports TVM once, then builds what it is sent, or runs each kernel in a
child forked from it."""
from __future__ import annotations

import contextlib
import ctypes
import json
import math
import mmap
import os
import pickle
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from opbench import settings
from opbench.measure.quiet import HostLoad, wait_until_idle
from opbench.measure.types import (
    BuildInput,
    BuildResult,
    CoRunGo,
    CoRunPrepare,
    CoRunResult,
    LibraryInput,
    RemoteConnect,
    RemoteSession,
    RunInput,
    RunResult,
    Status,
    Timing,
)

READY = "ready"
KERNEL, LIBRARY = "kernel", "library"  # a worker's role: TVM builds and kernels, or library baselines only
FLUSH_BYTES = 64 << 20  # evicted before each call when Timing.cache_flush: larger than any LLC here
HUGE_PAGE_BYTES = 2 << 20
HUGE_PAGE_MIN_BYTES = 256 << 10  # smaller arguments stay where TVM puts them
# A series of a slow kernel lasts about this long at most: it takes fewer repeats (at least MIN_REPEATS),
# and is not measured again for a high CV. A config 200x slower than the best (300-600 ms matmul-512
# configs, which TPE samples) otherwise took 2.5-11 s of a ~2 s trial budget.
SERIES_BUDGET_S = 1.0
MIN_REPEATS = 3
PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass
class _Kernel:
    """A loaded, checked kernel with its argument tensors (the module keeps its function alive)."""

    module: Any
    args: list[Any]
    first_s: float
    max_abs_err: float
    number: int = 1


def _on_huge_pages(array: Any) -> Any:
    """A CPU tensor holding a copy of ``array``, on transparent huge pages from a 2 MB boundary when it is
    at least :data:`HUGE_PAGE_MIN_BYTES` (``$OPBENCH_HUGE_ARGS=0``: where TVM puts it). Three of
    resnet50-c2's fastest schedules, each with 6 argument sets timed 4 times in one process, ran at
    1.22-1.43 ms (set medians) on 4 KB pages in two runs, and at 0.54-0.66 ms on huge pages in the runs
    right after each, in every set (page walks that miss the shared L3 when another tenant fills it,
    most likely; not proven)."""
    import numpy as np
    import tvm

    if not settings.huge_args() or array.nbytes < HUGE_PAGE_MIN_BYTES:
        return tvm.runtime.tensor(array, tvm.cpu(0))
    space = mmap.mmap(-1, array.nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no transparent huge pages: aligned all the same
        space.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(space, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    view = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return tvm.runtime.from_dlpack(view)


def _short(exc: BaseException, limit: int = 1500) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[:300] + " ... " + text[-(limit - 305):]


class _Inputs:
    """A workload's input arrays and its reference output, made once per worker."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[list[Any], Any]] = {}

    def __call__(self, spec: str) -> tuple[list[Any], Any]:
        if spec not in self._cache:
            from opbench.workloads import parse_workload

            workload = parse_workload(spec)
            arrays = workload.make_inputs()
            self._cache[spec] = (arrays, workload.reference(arrays))
        return self._cache[spec]


def _timed(timing: Timing, attempt: Callable[[], list[float]]) -> tuple[list[float], int, dict[str, float]]:
    """Run ``attempt`` (one timed series: per-call seconds, one per repeat) again while its CV exceeds
    ``timing.max_cv``, at most ``timing.max_remeasures`` more times and only while a series lasts at most
    :data:`SERIES_BUDGET_S`; the steadiest series, the extra attempts taken and the host's load during
    the series kept."""
    best: tuple[float, list[float], dict[str, float]] | None = None
    load = HostLoad()
    for extra in range(timing.max_remeasures + 1):  # noqa: B007 - the last value is returned
        load.start()
        tick = time.perf_counter()
        latencies = attempt()
        cv = _cv(latencies)
        if best is None or cv < best[0]:
            best = (cv, latencies, load.stop())
        if cv <= timing.max_cv or time.perf_counter() - tick > SERIES_BUDGET_S:
            break
    assert best is not None
    return best[1], extra, best[2]


def _cv(latencies: list[float]) -> float:
    mean = statistics.fmean(latencies)
    return statistics.pstdev(latencies) / mean if mean > 0 else 0.0


def _import_tvm() -> Any:
    """``import tvm`` without torch: tvm_ffi imports torch first when it can (4.3 s instead of 1.6 s
    here), though a kernel worker needs torch only for some references, which import it when they run."""
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
    try:
        import tvm
    finally:
        if blocked:
            del sys.modules["torch"]
    return tvm


class _Worker:
    """A kernel worker: builds, runs and co-runs TVM kernels, locally or on a remote session."""

    def __init__(self, cores: tuple[int, ...] | None, threads: int) -> None:
        _import_tvm()  # the expensive import, once per worker

        if cores:
            os.sched_setaffinity(0, cores)
        self._cores, self._threads = cores, threads
        self._pool_pid = 0  # the process whose TVM thread pool is sized and pinned: none yet
        self._inputs_for = _Inputs()
        self._corun: list[_Kernel] = []
        self._session: Any = None  # an RPC session: kernels are uploaded to and run on its device
        self._addr = ""  # its server's HOST:PORT
        self._meters: dict[bool, Any] = {}

    def _pool_here(self) -> None:
        """Size and pin TVM's thread pool in this process, which is about to run kernels (once a process)."""
        import tvm

        if self._pool_pid != os.getpid():
            self._pool_pid = os.getpid()
            if self._cores:
                tvm.get_global_func("runtime.config_threadpool")(-3, self._threads, [str(c) for c in self._cores])

    def build(self, req: BuildInput) -> BuildResult:
        import tvm
        from tvm import s_tir

        from opbench.exceptions import ConfigError
        from opbench.hardware.targets import export_compiler, make_target
        from opbench.measure.features import schedule_features
        from opbench.measure.prepack import split_prepack, write_manifest
        from opbench.space import get_template
        from opbench.space._schedule import WEIGHTS_PREPACKED
        from opbench.workloads import parse_workload

        start = time.perf_counter()
        workload = parse_workload(req.workload)
        template = get_template(workload, req.template)
        try:
            scheduled = template.schedule(workload, req.config)
            mod, prepack = scheduled, None
            if req.config.get("layout_transform") == WEIGHTS_PREPACKED:
                mod, prepack = split_prepack(scheduled)
        except (s_tir.ScheduleError, RuntimeError, ConfigError) as exc:  # TVM's FFI errors are RuntimeErrors
            return BuildResult(Status.INVALID_CONFIG, f"schedule rejected the config: {_short(exc)}")
        target = make_target(req.target, req.threads)
        try:
            executable = tvm.compile(mod, target)
            artifact = os.path.join(req.out_dir, f"kernel-{os.getpid()}-{time.monotonic_ns()}.so")
            executable.export_library(artifact, fcompile=export_compiler(req.target))
            if prepack is not None:
                write_manifest(artifact, prepack)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is a build error of this trial
            return BuildResult(Status.BUILD_ERROR, _short(exc), build_s=time.perf_counter() - start)
        build_s = time.perf_counter() - start
        features = schedule_features(scheduled, target) if req.extract_features and target.kind.name == "llvm" else {}
        return BuildResult(Status.OK, artifact=artifact, build_s=build_s, target=str(target), features=features)

    def connect(self, req: RemoteConnect) -> RemoteSession:
        """Hold a session on a free device of the key (dropping any earlier one)."""
        from opbench.exceptions import ResourceError
        from opbench.hardware.board import BOARD_INFO
        from opbench.measure.rpc import RemoteDevice, request_session

        self._session, self._meters = None, {}
        try:
            session, addr = request_session(RemoteDevice(req.host, req.port, req.key))
        except ResourceError as exc:
            return RemoteSession(Status.DEVICE_ERROR, str(exc))
        except Exception as exc:  # noqa: BLE001 - TVM's RPC raises plain RuntimeErrors
            return RemoteSession(Status.DEVICE_ERROR, f"connecting to a '{req.key}' device: {_short(exc)}")
        try:
            facts = json.loads(session.get_function(BOARD_INFO)())
        except Exception:  # noqa: BLE001 - a plain TVM rpc_server reports no facts
            facts = {}
        self._session, self._addr = session, addr
        return RemoteSession(Status.OK, addr=addr, facts=facts)

    def _device(self, target: str) -> Any:
        import tvm

        from opbench.hardware.targets import is_gpu

        owner = self._session or tvm
        return owner.cuda(0) if is_gpu(target) else owner.cpu(0)

    def _meter(self, target: str) -> Any:
        from opbench.hardware.energy import BoardMeter, local_meter
        from opbench.hardware.targets import is_gpu

        gpu = is_gpu(target)
        if gpu not in self._meters:
            self._meters[gpu] = BoardMeter.of(self._session) if self._session else local_meter(gpu)
        return self._meters[gpu]

    def _load_checked(self, artifact: str, spec: str, target: str = "llvm") -> _Kernel | RunResult:
        """Load a kernel (on the remote device, when in a session), pack its weight when it takes it
        packed, call it once on the workload's inputs and check the output against the reference
        computed here."""
        import numpy as np
        import tvm

        from opbench.hardware.targets import is_gpu
        from opbench.measure.prepack import prepacked_args, read_manifest
        from opbench.workloads import parse_workload

        workload = parse_workload(spec)
        arrays, expected = self._inputs_for(spec)
        dev = self._device(target)
        if self._session is not None:
            self._session.upload(artifact)
            module = self._session.load_module(os.path.basename(artifact))
        else:
            module = tvm.runtime.load_module(artifact)
        place = _on_huge_pages if self._session is None and not is_gpu(target) else lambda a: tvm.runtime.tensor(a, dev)
        args = [place(a) for a in arrays]
        args.append(place(np.zeros(expected.shape, expected.dtype)))
        args = prepacked_args(module, args, read_manifest(artifact), dev)
        first = time.perf_counter()
        module["main"](*args)
        dev.sync()
        first = time.perf_counter() - first
        got = args[-1].numpy()
        rtol, atol = workload.tolerance()
        err = float(np.max(np.abs(got.astype("float64") - expected))) if got.size else 0.0
        if not np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=False):
            return RunResult(Status.WRONG_RESULT, f"{workload.name}: output differs from the reference: "
                                                  f"max |err| = {err:.3g}", max_abs_err=err)
        return _Kernel(module, args, first, err)

    def run(self, req: RunInput) -> RunResult:
        if self._session is None:
            if self._pristine(req.target):
                self._inputs_for(req.workload)  # made here once: every child has them
                result = _in_child(lambda: self._run(req))
                result.pid = os.getpid()
                return result
            result = self._run(req)
            result.kernel_pid = os.getpid()
            wait_until_idle()  # our pool stops spinning before the timing lock is released
            return result
        try:
            return self._run(req)
        except Exception as exc:
            if self._session_alive():
                raise
            self._session = None
            return RunResult(Status.DEVICE_ERROR, f"session to {self._addr} ended during the run (device lost, or "
                                                  f"the kernel crashed its server): {_short(exc, 400)}")

    def _pristine(self, target: str) -> bool:
        """Whether a CPU run of ``target`` goes to a child forked from this process, which then never runs a
        kernel itself (a GPU run, or any run once a co-run has started TVM's pool here, runs in this
        process: CUDA, and a pool's threads, do not survive a fork)."""
        from opbench.hardware.targets import is_gpu

        return not is_gpu(target) and self._pool_pid == 0

    def _session_alive(self) -> bool:
        try:
            self._session.get_function("tvm.rpc.server.workpath")("probe")  # a round trip to the server
            return True
        except Exception:  # noqa: BLE001
            return False

    def _run(self, req: RunInput) -> RunResult:
        """Load, check and time a kernel in this process (a child's, a GPU's, a co-run worker's, or on the
        remote session's device)."""
        start = time.perf_counter()
        if self._session is None:
            self._pool_here()
        kernel = self._load_checked(req.artifact, req.workload, req.target)
        if isinstance(kernel, RunResult):
            kernel.run_s = time.perf_counter() - start
            return kernel
        timing = req.timing
        device = self._device(req.target)
        main = kernel.module["main"]
        number, repeat = _series_shape(timing, kernel.first_s, lambda: (main(*kernel.args), device.sync()))
        # One extra repeat, dropped: the first runs with cold caches and a thread pool waking up.
        evaluator = kernel.module.time_evaluator("main", device, number=number, repeat=repeat + 1,
                                                 cache_flush_bytes=FLUSH_BYTES if timing.cache_flush else 0)
        meter = self._meter(req.target)
        if meter is not None:
            meter.start()
        tick = time.perf_counter()
        latencies, remeasures, load = _timed(timing, lambda: list(evaluator(*kernel.args).results)[1:])
        joules = meter.stop() if meter is not None else None
        result = RunResult(Status.OK, latencies_s=latencies, number=number, run_s=time.perf_counter() - start,
                           max_abs_err=kernel.max_abs_err, remeasures=remeasures, load=load, pid=os.getpid())
        if joules is not None:
            calls = number * (repeat + 1) * (remeasures + 1)
            result.energy_j = joules / calls
            result.power_w = joules / (time.perf_counter() - tick)
        return result

    def corun_prepare(self, req: CoRunPrepare) -> CoRunResult:
        self._pool_here()
        self._corun = []
        for artifact, spec in zip(req.artifacts, req.workloads):
            kernel = self._load_checked(artifact, spec)
            if isinstance(kernel, RunResult):
                return CoRunResult(kernel.status, kernel.error)
            kernel.number = _number(req.sample_ms, kernel.first_s)
            self._corun.append(kernel)
        return CoRunResult(Status.OK, numbers=[k.number for k in self._corun],
                           max_abs_err=[k.max_abs_err for k in self._corun])

    def corun_go(self, req: CoRunGo) -> CoRunResult:
        kernels = self._corun
        if not kernels:
            return CoRunResult(Status.RUN_ERROR, "co-run: nothing prepared")
        fns = [k.module["main"] for k in kernels]
        while time.monotonic() < req.start_at - 0.002:
            time.sleep(0.001)
        while time.monotonic() < req.start_at:
            pass
        late = time.monotonic() - req.start_at
        latencies: list[list[float]] = [[] for _ in kernels]
        rounds: list[float] = []
        while time.monotonic() < req.stop_at or len(rounds) < req.min_samples:
            for fn, kernel, out in zip(fns, kernels, latencies):
                tick = time.perf_counter()
                for _ in range(kernel.number):
                    fn(*kernel.args)
                out.append((time.perf_counter() - tick) / kernel.number)
            rounds.append(sum(out[-1] for out in latencies))
        self._corun = []
        return CoRunResult(Status.OK, latencies_s=latencies, numbers=[k.number for k in kernels], rounds_s=rounds,
                           started_late_s=late, max_abs_err=[k.max_abs_err for k in kernels])

class _LibraryWorker:
    """Times library baselines (torch, numpy) with the worker's threads and cores. It never imports
    TVM, so no TVM kernel or thread pool ever runs in its process."""

    def __init__(self, cores: tuple[int, ...] | None, threads: int) -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        self._threads = threads
        self._inputs_for = _Inputs()
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
        number, repeat = _series_shape(timing, time.perf_counter() - first, call)

        def series() -> list[float]:
            latencies = []
            for _ in range(repeat + 1):
                if self._flush is not None:
                    self._flush += 1.0  # writes every line: the inputs are evicted
                tick = time.perf_counter()
                for _ in range(number):
                    call()
                latencies.append((time.perf_counter() - tick) / number)
            return latencies[1:]

        latencies, remeasures, load = _timed(timing, series)
        return RunResult(Status.OK, latencies_s=latencies, number=number, run_s=time.perf_counter() - start,
                         remeasures=remeasures, load=load, pid=os.getpid())


def _in_child(run: Callable[[], RunResult]) -> RunResult:
    """``run()`` in a child forked from this process, its result sent back through a pipe; this process
    stays as it was. A kernel worker that ran kernels itself timed resnet50-c2's fastest schedule 5-8%
    slower than a fresh process did (0.575-0.59 ms against 0.54) from the moment one particular other
    schedule had run there; the workspace blocks TVM's pool gave its intermediates had moved, and its
    time depends on where they lie (0.54-0.60 ms across the placements tried), the likeliest cause. In
    children of a worker that never runs a kernel it timed 0.53-0.55 ms, before and after children had
    run 12 others. A child that dies fails its run only."""
    parent = os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it never returns
        code = 1
        try:
            os.close(read)
            _die_with(parent)
            try:
                result = run()
            except Exception as exc:  # noqa: BLE001 - this run's error
                result = RunResult(Status.RUN_ERROR, _short(exc) + "\n" + traceback.format_exc(limit=3))
            with os.fdopen(write, "wb") as out:
                out.write(pickle.dumps(result))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        data = answer.read()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        return RunResult(Status.RUN_ERROR, f"the kernel's process died ({describe_exit(code)})")
    answered: RunResult = pickle.loads(data)
    answered.kernel_pid = pid
    return answered


def _die_with(parent: int) -> None:
    """Have this child killed when its worker dies (the parent kills a worker whose run hangs)."""
    with contextlib.suppress(AttributeError, OSError):  # prctl: Linux only
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before that
        os._exit(1)


def describe_exit(exitcode: int | None) -> str:
    """A process's exit code (negative: the signal that killed it) in words."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _series_shape(timing: Timing, first_s: float, call: Callable[[], object]) -> tuple[int, int]:
    """Calls per timed repeat (``number``) and repeats of a series of ``call``, whose first call took
    ``first_s``. A first call shorter than a repeat should last is followed by a second, which sizes the
    series: the first starts the thread pool (a forked run's always does) and touches everything cold,
    so matmul-512's 1.3 ms kernels got 7-15 calls a repeat, whose 50 ms repeats lasted 9-20 ms."""
    one_call_s = first_s
    if not timing.cache_flush and first_s < timing.min_repeat_ms / 1e3:
        tick = time.perf_counter()
        call()
        one_call_s = min(first_s, time.perf_counter() - tick)
    number = 1 if timing.cache_flush else _number(timing.min_repeat_ms, one_call_s)
    return number, _repeats(timing, number * one_call_s)


def _repeats(timing: Timing, repeat_s: float) -> int:
    """Timed repeats of a series whose repeats last ``repeat_s``: ``timing.repeat``, fewer (down to
    :data:`MIN_REPEATS`) where they would take longer than :data:`SERIES_BUDGET_S`."""
    fit = math.floor(SERIES_BUDGET_S / max(repeat_s, 1e-9))
    return min(timing.repeat, max(MIN_REPEATS, fit))


def _number(min_repeat_ms: float, one_call_s: float) -> int:
    """Calls per timed repeat so that one repeat lasts at least ``min_repeat_ms``."""
    return max(1, math.ceil(min_repeat_ms / 1e3 / max(one_call_s, 1e-7)))


def serve(conn: Connection, cores: tuple[int, ...] | None, threads: int, role: str = KERNEL) -> None:
    """Answer requests until the connection closes (the environment is already set)."""
    try:
        if role == LIBRARY:
            library = _LibraryWorker(cores, threads)
            handlers: dict[type, Callable[[Any], Any]] = {LibraryInput: library.library}
        else:
            worker = _Worker(cores, threads)
            handlers = {BuildInput: worker.build, RunInput: worker.run, CoRunPrepare: worker.corun_prepare,
                        CoRunGo: worker.corun_go, RemoteConnect: worker.connect}
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure to the parent
        conn.send(("error", _short(exc)))
        return
    conn.send((READY, os.getpid()))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        kind = {BuildInput: BuildResult, CoRunPrepare: CoRunResult, CoRunGo: CoRunResult,
                RemoteConnect: RemoteSession}.get(type(request), RunResult)
        handler = handlers.get(type(request))
        if handler is None:
            conn.send(kind(Status.RUN_ERROR, f"a {role} worker does not take {type(request).__name__}"))
            continue
        try:
            result = handler(request)
        except Exception as exc:  # noqa: BLE001 - an unexpected error fails this request only
            status = Status.BUILD_ERROR if isinstance(request, BuildInput) else Status.RUN_ERROR
            result = kind(status, _short(exc) + "\n" + traceback.format_exc(limit=3))
        conn.send(result)


if __name__ == "__main__":
    import pickle

    from opbench.plugins import load_plugins

    load_plugins()  # the parent's OPBENCH_PLUGINS: operators it names can be built and run here
    serve(Connection(int(sys.argv[1])), *pickle.loads(bytes.fromhex(sys.argv[2])))
