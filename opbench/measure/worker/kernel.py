"""The kernel worker: imports TVM once, builds what it is sent, loads and checks a kernel, and times it
(in a child forked for the run, or here), on this host, a remote device or beside other kernels."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opbench.hardware.quiet import wait_until_idle
from opbench.measure.protocol import (
    BuildInput,
    BuildResult,
    CoRunGo,
    CoRunPrepare,
    CoRunResult,
    ModelInput,
    ModelProfileInput,
    PeakInput,
    PrimFuncInput,
    RemoteConnect,
    RemoteSession,
    RunInput,
    RunResult,
)
from opbench.measure.timing import calls_per_repeat
from opbench.measure.worker._common import COLD, Inputs, short_error, time_series
from opbench.measure.worker.fork import in_child
from opbench.measure.worker.layout import fixed_mmap_threshold
from opbench.measure.worker.model import profile_model, time_model
from opbench.measure.worker.placement import argument_placement
from opbench.measure.worker.standalone import peak_timer, primfunc_timer
from opbench.record import Status


@dataclass
class LoadedKernel:
    """A loaded, checked kernel with its argument tensors (the module keeps its function alive)."""

    module: Any
    args: list[Any]
    first_s: float
    max_abs_err: float
    number: int = 1


class KernelWorker:
    """A kernel worker: builds, runs and co-runs TVM kernels, locally or on a remote session."""

    def __init__(self, cores: tuple[int, ...] | None, threads: int) -> None:
        import tvm  # noqa: F401 - the expensive import, once per worker (without torch: opbench._tvm_compat)

        if cores:
            os.sched_setaffinity(0, cores)
        self._cores, self._threads = cores, threads
        self._pool_pid = 0  # the process whose TVM thread pool is sized and pinned: none yet
        self._inputs_for = Inputs()
        self._corun: list[LoadedKernel] = []
        self._session: Any = None  # an RPC session: kernels are uploaded to and run on its device
        self._addr = ""  # its server's HOST:PORT
        self._loaded: dict[str, Any] = {}  # the latest artifact -> its module on the session's device
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
        from opbench.hardware.cpu_shape import shaped_for
        from opbench.hardware.targets import export_compiler, make_target
        from opbench.measure.assembly import assembly_features, export_kernel
        from opbench.measure.features import schedule_features
        from opbench.measure.memory import compile_lowered, lowered, lowered_memory
        from opbench.measure.prepack import split_prepack, write_manifest
        from opbench.space import get_template
        from opbench.space._schedule import WEIGHTS_PREPACKED
        from opbench.workloads import parse_workload

        start = time.perf_counter()
        workload = parse_workload(req.workload)
        template = get_template(workload, req.template)
        try:
            with shaped_for(req.target):  # a board's kernels take its vectors
                scheduled = template.schedule(workload, req.config)
            mod, prepack = scheduled, None
            if req.config.get("layout_transform") == WEIGHTS_PREPACKED:
                mod, prepack = split_prepack(scheduled)
        except (s_tir.ScheduleError, RuntimeError, ConfigError) as exc:  # TVM's FFI errors are RuntimeErrors
            return BuildResult(Status.INVALID_CONFIG, f"schedule rejected the config: {short_error(exc)}")
        target = make_target(req.target, req.threads)
        try:
            low = lowered(mod, target)  # once: the memory is read from it, and it is compiled
        except Exception as exc:  # noqa: BLE001 - a lowering failure is a build error of this trial
            return BuildResult(Status.BUILD_ERROR, short_error(exc), build_s=time.perf_counter() - start)
        memory = lowered_memory(tvm.IRModule({"main": low["main"]}), workload.prim_func(), req.threads)
        if prepack is not None:
            memory["mem.prepacked"] = float(prepack.nbytes)
        if req.max_workspace is not None and memory["mem.workspace"] > req.max_workspace:
            return BuildResult(Status.INVALID_CONFIG, f"workspace of {memory['mem.workspace']:.0f} bytes is over the "
                                                      f"budget (--max-workspace {req.max_workspace})", memory=memory)
        try:
            executable = compile_lowered(low, target)
            artifact = os.path.join(req.out_dir, f"kernel-{os.getpid()}-{time.monotonic_ns()}.so")
            asm = export_kernel(executable, artifact, target, export_compiler(req.target), req.extract_features)
            if prepack is not None:
                write_manifest(artifact, prepack)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is a build error of this trial
            return BuildResult(Status.BUILD_ERROR, short_error(exc), build_s=time.perf_counter() - start)
        build_s = time.perf_counter() - start
        features = {}
        if req.extract_features and target.kind.name == "llvm":
            features = {**schedule_features(scheduled, target), **(assembly_features(asm) if asm else {})}
        return BuildResult(Status.OK, artifact=artifact, build_s=build_s, target=str(target), features=features,
                           memory=memory)

    def connect(self, req: RemoteConnect) -> RemoteSession:
        """Hold a session on a free device of the key (dropping any earlier one)."""
        from opbench.exceptions import ResourceError
        from opbench.hardware.board import BOARD_INFO
        from opbench.measure.rpc import RemoteDevice, request_session

        self._session, self._meters, self._loaded = None, {}, {}
        try:
            session, addr = request_session(RemoteDevice(req.host, req.port, req.key))
        except ResourceError as exc:
            return RemoteSession(Status.DEVICE_ERROR, str(exc))
        except Exception as exc:  # noqa: BLE001 - TVM's RPC raises plain RuntimeErrors
            return RemoteSession(Status.DEVICE_ERROR, f"connecting to a '{req.key}' device: {short_error(exc)}")
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

    def load_checked(self, artifact: str, spec: str, target: str = "llvm") -> LoadedKernel | RunResult:
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
        if self._session is not None:  # each later placement of the artifact: fresh arguments, the module kept
            if artifact not in self._loaded:
                self._session.upload(artifact)
                self._loaded = {artifact: self._session.load_module(os.path.basename(artifact))}
            module = self._loaded[artifact]
        else:
            module = tvm.runtime.load_module(artifact)
        place, empty = argument_placement(dev, on_huge_pages=self._session is None and not is_gpu(target))
        args = [place(a) for a in arrays]
        args.append(place(np.zeros(expected.shape, expected.dtype)))
        args = prepacked_args(module, args, read_manifest(artifact), empty)
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
        return LoadedKernel(module, args, first, err)

    def run(self, req: RunInput) -> RunResult:
        fixed_mmap_threshold()  # here only: PyTorch and the Relax VM allocate per call, glibc's threshold serves them
        if self._session is None:
            if self._pristine(req.target):
                self._inputs_for(req.workload)  # made here once: every child has them
            return self._placed(req.target, lambda: self._run(req))
        try:
            return self._run(req)
        except Exception as exc:
            if self._session_alive():
                raise
            self._session = None
            return RunResult(Status.DEVICE_ERROR, f"session to {self._addr} ended during the run (device lost, or "
                                                  f"the kernel crashed its server): {short_error(exc, 400)}")

    def _placed(self, target: str, run: Callable[[], RunResult]) -> RunResult:
        """``run()`` in a child forked for it (one placement: its own arguments, pages and library mapping) while
        this process is pristine, else here, its pool idle again before it returns."""
        if self._pristine(target):
            result = in_child(run)
            result.pid = os.getpid()
            return result
        result = run()
        result.kernel_pid = os.getpid()
        wait_until_idle()  # our pool stops spinning before the timing lock is released
        return result

    def peak(self, req: PeakInput) -> RunResult:
        """Time the host's peak kernel for the request's threads (built here, then placed as a kernel run is)."""
        return self._placed("llvm", peak_timer(req, self._pool_here))

    def primfunc(self, req: PrimFuncInput) -> RunResult:
        """Time a model's operator compiled alone (built here, then placed as a kernel run is)."""
        return self._placed("llvm", primfunc_timer(req, self._pool_here))

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
        from opbench.hardware.targets import is_gpu

        start = time.perf_counter()
        if self._session is None:
            self._pool_here()
        kernel = self.load_checked(req.artifact, req.workload, req.target)
        if isinstance(kernel, RunResult):
            kernel.run_s = time.perf_counter() - start
            return kernel
        device = self._device(req.target)
        main = kernel.module["main"]
        cold = COLD if req.timing.cache_flush and not is_gpu(req.target) else ""

        def evaluate(number: int, repeat: int) -> list[float]:
            evaluator = kernel.module.time_evaluator("main", device, number=number, repeat=repeat, f_preproc=cold)
            return list(evaluator(*kernel.args).results)

        meter = self._meter(req.target)
        if meter is not None:
            meter.start()
        tick = time.perf_counter()
        latencies, number, load = time_series(req.timing, kernel.first_s, lambda: (main(*kernel.args), device.sync()), evaluate)
        series_s = time.perf_counter() - tick
        joules = meter.stop() if meter is not None else None
        result = RunResult(Status.OK, latencies_s=latencies, number=number, run_s=time.perf_counter() - start,
                           max_abs_err=kernel.max_abs_err, load=load, pid=os.getpid())
        if joules is not None:
            result.energy_j = joules / (number * (len(latencies) + req.timing.warmup_repeats(kernel.first_s)))
            result.power_w = joules / series_s
        return result

    def model(self, req: ModelInput) -> RunResult:
        """Time a whole model on the Relax VM, in a child forked for the run as a kernel is."""
        return self._placed("llvm", lambda: self._model(req))

    def _model(self, req: ModelInput) -> RunResult:
        self._pool_here()
        return time_model(req)

    def model_profile(self, req: ModelProfileInput) -> RunResult:
        """Profile a built model call by call, in a child forked for it as a kernel run is."""
        def profiled() -> RunResult:
            self._pool_here()
            return profile_model(req)

        return self._placed("llvm", profiled)

    def corun_prepare(self, req: CoRunPrepare) -> CoRunResult:
        self._pool_here()
        self._corun = []
        for artifact, spec in zip(req.artifacts, req.workloads):
            kernel = self.load_checked(artifact, spec)
            if isinstance(kernel, RunResult):
                return CoRunResult(kernel.status, kernel.error)
            kernel.number = calls_per_repeat(req.sample_ms, kernel.first_s)
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

