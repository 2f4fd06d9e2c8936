"""The wire between the measurer and its worker processes (local, RPC, co-run): the explicit inputs and
results of the builder and the runner (as MetaSchedule's ``RunnerInput``/``RunnerResult``), all picklable."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opbench.hardware.resources import Resources
from opbench.measure.timing import TimingPolicy
from opbench.record import Status


@dataclass(frozen=True)
class BuildInput:
    workload: str  # canonical spec, parsed again in the worker
    template: str
    config: dict[str, Any]
    target: str  # "llvm" or "cuda": the worker turns it into a host TVM target
    threads: int
    out_dir: str
    extract_features: bool = True
    max_workspace: int | None = None  # bytes: a schedule that allocates more is an invalid config, not built


@dataclass
class BuildResult:
    status: Status
    error: str = ""
    artifact: str | None = None  # path of the exported shared library
    build_s: float = 0.0
    target: str = ""  # the full TVM target it was built for
    features: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)  # the mem.* columns (opbench.measure.memory)


@dataclass(frozen=True)
class RunInput:
    artifact: str
    workload: str
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    resources: Resources = Resources()  # threads and cores of the worker it runs in; target picks CPU or GPU

    @property
    def target(self) -> str:
        return self.resources.target


@dataclass(frozen=True)
class LibraryInput:
    """Time a library's implementation of a workload (``torch`` or ``numpy``): the baselines."""

    workload: str
    library: str
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    resources: Resources = Resources()


@dataclass(frozen=True)
class ModelProfileInput:
    """Profile a built model call by call: ms a model run of each function it calls (its kernels by operator
    name), over ``runs`` runs after one warm-up, by the Relax VM's instrumentation (``RunResult.op_ms``)."""

    library: str
    inputs: str
    runs: int = 3
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    resources: Resources = Resources()


@dataclass(frozen=True)
class PeakInput:
    """Time the host's peak kernel (:mod:`opbench.hardware.peak`) of ``dtype`` with the resources' threads."""

    dtype: str = "float32"
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    resources: Resources = Resources()


@dataclass(frozen=True)
class PrimFuncInput:
    """Time a PrimFunc given as TVMScript (a model's fused operator as TVM lowers it) compiled alone for
    ``target`` (a TVM target's JSON, or a name such as ``llvm``), on random inputs: there is no reference to
    check it against."""

    script: str
    target: str
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    resources: Resources = Resources()


TVM, EAGER, INDUCTOR, ONNXRUNTIME = "tvm", "eager", "torch.compile", "onnxruntime"  # what runs a whole model
OPENVINO, ZENTORCH, TORCH_SPARSE = "openvino", "zentorch", "torch-sparse"  # torch-sparse: a model's sparse_form()
TORCH_INT8 = "torch-int8"  # PyTorch's dynamic quantization of a quantized model's (+int8) Linear layers
FRAMEWORKS = (EAGER, INDUCTOR, ONNXRUNTIME, OPENVINO, ZENTORCH, TORCH_SPARSE, TORCH_INT8)  # run in a library worker: never
# imports TVM


@dataclass(frozen=True)
class ModelInput:
    """Time a whole model: the artifact ``library`` as ``runtime`` runs it (a Relax VM library exported by
    :func:`opbench.measure.models.export_model` for TVM, an AOTInductor package for torch.compile, an ONNX
    file for ONNX Runtime and OpenVINO) on the inputs saved in ``inputs`` (``.npz``, with the reference output),
    or PyTorch eager (or compiled by zentorch) on the catalogue model ``model``. The runtime defaults to TVM with a library, else eager."""

    model: str
    batch: int = 1
    seq_len: int = 128
    library: str = ""
    inputs: str = ""
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    resources: Resources = Resources()
    runtime: str = ""

    @property
    def system(self) -> str:
        return self.runtime or (TVM if self.library else EAGER)


@dataclass
class RunResult:
    status: Status
    error: str = ""
    latencies_s: list[float] = field(default_factory=list)
    number: int = 0
    run_s: float = 0.0
    max_abs_err: float = float("nan")
    energy_j: float | None = None  # per call, when a meter could be read
    power_w: float | None = None
    device_addr: str = ""  # the remote server (HOST:PORT) the kernel ran on; empty when local
    device_facts: dict[str, Any] = field(default_factory=dict)  # that server's HostFacts, when it reports them
    placement_sizes: list[int] = field(default_factory=list)  # each placement's repeats, in latencies_s's order
    host_wait_s: float = 0.0  # spent probing the host's speed and waiting for its cores to share a cache
    load: dict[str, float] = field(default_factory=dict)  # the host's load while timing (HostLoad.stop)
    pid: int = 0  # the worker that ran it
    kernel_pid: int = 0  # the process that ran the kernel: a child forked from the worker for it, or the worker
    memory: dict[str, float] = field(default_factory=dict)  # mem.* a library states about its own call
    op_ms: dict[str, float] = field(default_factory=dict)  # a profiled model: ms a run per operator (ModelProfileInput)

    @property
    def placements(self) -> int:
        """Placements its repeats were taken in (docs/measurement.md#placements)."""
        return max(1, len(self.placement_sizes))


@dataclass(frozen=True)
class RemoteConnect:
    """Get a session on a free device of ``key`` from the tracker at ``host:port``."""

    host: str
    port: int
    key: str


@dataclass
class RemoteSession:
    status: Status
    error: str = ""
    addr: str = ""  # HOST:PORT of the server the tracker gave us
    facts: dict[str, Any] = field(default_factory=dict)  # its HostFacts (servers started by `opbench board serve`)


@dataclass(frozen=True)
class CoRunPrepare:
    """Load and check kernels in a co-run member; it then waits, ready, for :class:`CoRunGo`."""

    artifacts: tuple[str, ...]
    workloads: tuple[str, ...]  # canonical specs, one per artifact
    sample_ms: float = 2.0  # one timed sample repeats a kernel until it lasts this long (0: one call)


@dataclass(frozen=True)
class CoRunGo:
    """Run the prepared kernels back to back, from ``start_at`` (``time.monotonic``, the same clock in
    every process: the barrier) until ``stop_at``, and at least ``min_samples`` rounds."""

    start_at: float
    stop_at: float
    min_samples: int = 3


@dataclass
class CoRunResult:
    status: Status
    error: str = ""
    latencies_s: list[list[float]] = field(default_factory=list)  # per kernel, one per sample (per call)
    numbers: list[int] = field(default_factory=list)  # calls per sample, per kernel
    rounds_s: list[float] = field(default_factory=list)  # per round: the sum of its kernels' per-call latencies
    started_late_s: float = 0.0  # how long after start_at the first round began
    max_abs_err: list[float] = field(default_factory=list)
