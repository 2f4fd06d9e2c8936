"""Resources of a trial (threads, core set, target) and facts about the host, collected once."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from opbench.exceptions import ResourceError
from opbench.hardware.devices import parse_device
from opbench.hardware.targets import BOARDS, check_target, cpu_flags

LOCAL = "local"
# TVM's pool workers spin (sched_yield in a loop) this many times before they sleep. TVM 0.27's default,
# 300000, kept a 2-thread process burning a core for ~235 ms after its last kernel (measured here),
# slowing whatever ran next on those cores; 10000 stops within ~8 ms, and back-to-back calls (what
# time_evaluator times) ran as fast.
POOL_SPIN_COUNT = "10000"
MAX_CORE_ID = 4096  # Linux's CONFIG_NR_CPUS limit on x86 distributions: no core set reaches past it


@dataclass(frozen=True)
class Resources:
    """Threads a kernel runs with, optionally the cores they are pinned to, its target and device.

    ``device`` is ``local`` or a tracker spec ``rpc://HOST:PORT/KEY`` (see :mod:`opbench.measure.rpc`);
    a remote device's core set is the board's, so it is not checked against this host.
    """

    threads: int = 1
    cores: tuple[int, ...] | None = None
    target: str = "llvm"
    device: str = LOCAL

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ResourceError(f"threads must be >= 1, got {self.threads}")
        check_target(self.target)
        if self.device != LOCAL:
            parse_device(self.device)
            if self.cores is not None:
                raise ResourceError("core sets apply to local runs only; a board's RPC server sets its own")
        elif self.target in BOARDS:
            raise ResourceError(f"target '{self.target}' is a board: measure it through a tracker, "
                                f"e.g. --device rpc://HOST:9190/{self.target}")
        if self.cores is not None:
            available = os.sched_getaffinity(0)
            missing = [c for c in self.cores if c not in available]
            if missing:
                raise ResourceError(f"core(s) {missing} not available to this process (have {sorted(available)})")
            if len(self.cores) < 1:
                raise ResourceError("core set is empty")

    @property
    def remote(self) -> bool:
        return self.device != LOCAL

    @property
    def cores_label(self) -> str:
        return ",".join(map(str, self.cores)) if self.cores else "any"

    def worker_env(self) -> dict[str, str]:
        """Environment a runner worker needs before TVM's (or OpenMP's) thread pool first starts; a
        user's own ``TVM_THREAD_POOL_SPIN_COUNT`` wins over ours.

        OpenMP's threads are not bound: binding (``OMP_PROC_BIND``) pins the thread that starts OpenMP to the
        first core, and every thread a library starts after it inherits that core (OpenVINO's and ONNX Runtime's
        pools ran both their threads on one core, 2x slower, in the library worker that had run PyTorch)."""
        n = str(self.threads)
        return {"TVM_NUM_THREADS": n, "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
                "TVM_THREAD_POOL_SPIN_COUNT": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT", POOL_SPIN_COUNT)}


def parse_cores(text: str | None) -> tuple[int, ...] | None:
    """``"0,1"`` or ``"0-3"`` into a tuple of core ids; None or ``"any"`` means unpinned."""
    if text is None or text in ("", "any"):
        return None
    cores: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ResourceError(f"malformed core set '{text}': use e.g. 0,1 or 0-3")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first or last >= MAX_CORE_ID:
            raise ResourceError(f"core range '{part.strip()}' of '{text}' is empty or beyond core {MAX_CORE_ID - 1}")
        cores.extend(range(first, last + 1))
    return tuple(dict.fromkeys(cores))


def set_tvm_threads(threads: int) -> None:
    """Size TVM's thread pool for kernels run in this process, its threads sharing every core the
    process may use. (``runtime.config_threadpool`` with an empty core list pins the calling thread,
    and so every process it starts later, to core 0.)"""
    import tvm

    cores = [str(c) for c in sorted(os.sched_getaffinity(0))]
    tvm.get_global_func("runtime.config_threadpool")(-3, threads, cores)


def parse_thread_counts(text: str, what: str = "--threads") -> list[int]:
    """``"1,2,4"`` into thread counts (each >= 1), in the order given; the error names the flag."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise ResourceError(f"{what} must be comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise ResourceError(f"{what} needs thread counts >= 1, got {text!r}")
    return values

FEATURE_FLAGS = ("avx2", "avx512f", "fma")  # the ISA flags a predictor's host features say (feat.avx2, feat.avx512, ...)


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu_model: str
    cores: int
    mhz: float
    l1d_kb: float
    l2_kb: float
    l3_kb: float
    mem_gb: float
    isa: tuple[str, ...]
    tvm_version: str
    l1d_ways: int = 0  # 0: not known
    cpu_id: str = ""  # the CPU's identity as /proc/cpuinfo numbers it (:func:`cpu_identity`); empty: not known

    @functools.cached_property
    def device_key(self) -> str:
        """Where a number was measured, precise enough to compare like with like (what ``cpu_model``, "AMD EPYC" on
        three generations, is not): the CPU's identity, its core count and a digest of its ISA and caches."""
        detail = f"{','.join(self.isa)}|{self.l1d_kb:g}|{self.l1d_ways}|{self.l2_kb:g}|{self.l3_kb:g}"
        return f"{self.cpu_id or 'unknown'}/{self.cores}c/{hashlib.sha256(detail.encode()).hexdigest()[:8]}"

    @classmethod
    def from_dict(cls, facts: dict) -> HostFacts:
        """Facts a remote board reported (JSON: lists for tuples)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"isa"}
        return cls(**{k: v for k, v in facts.items() if k in known}, isa=tuple(facts.get("isa", ())))

    @classmethod
    def unknown(cls, name: str) -> HostFacts:
        """A device that reports nothing (a plain TVM RPC server): every number is NaN."""
        nan = float("nan")
        return cls(name, "unknown", 0, nan, nan, nan, nan, nan, (), "unknown")

    def features(self) -> dict[str, float]:
        return {
            "feat.host_cores": self.cores, "feat.host_mhz": self.mhz, "feat.l1d_kb": self.l1d_kb,
            "feat.l2_kb": self.l2_kb, "feat.l3_kb": self.l3_kb,
            **{f"feat.{flag.removesuffix('f')}": float(flag in self.isa) for flag in FEATURE_FLAGS},
        }

    @classmethod
    def of_features(cls, features: Mapping[str, float], name: str) -> HostFacts:
        """The facts :meth:`features` keeps (a dataset row's ``feat.*`` host columns), of the device ``name``."""
        return cls(name, "unknown", cores=int(features["feat.host_cores"]), mhz=float(features["feat.host_mhz"]),
                   l1d_kb=float(features["feat.l1d_kb"]), l2_kb=float(features["feat.l2_kb"]),
                   l3_kb=float(features["feat.l3_kb"]), mem_gb=float("nan"), tvm_version="unknown",
                   isa=tuple(flag for flag in FEATURE_FLAGS if features.get(f"feat.{flag.removesuffix('f')}") == 1.0))


def _cache_dir(level: int, kinds: tuple[str, ...]) -> Path | None:
    """The sysfs folder describing cpu0's cache of this level and kind."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() in kinds:
                return index
        except (OSError, ValueError):
            continue
    return None


def _cache_kb(level: int, kinds: tuple[str, ...]) -> float:
    index = _cache_dir(level, kinds)
    try:
        size = (index / "size").read_text().strip() if index else ""
        return float(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" else float(size) / 1024
    except (OSError, ValueError, IndexError):
        return float("nan")


def _l1d_ways() -> int:
    index = _cache_dir(1, ("Data",))
    try:
        return int((index / "ways_of_associativity").read_text()) if index else 0
    except (OSError, ValueError):
        return 0


def cpu_identity(cpuinfo: str) -> str:
    """Vendor, family, model and stepping of an x86 CPU (``AuthenticAMD/25.1.1``); implementer, part, variant and
    revision of an Arm one; empty where /proc/cpuinfo says neither."""
    def field_of(name: str) -> str:
        found = re.search(rf"^{name}\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
        return found.group(1).strip() if found else ""

    x86 = [field_of(n) for n in ("vendor_id", "cpu family", "model", "stepping")]
    if x86[0]:
        return f"{x86[0]}/{'.'.join(x86[1:])}"
    arm = [field_of(n) for n in ("CPU implementer", "CPU part", "CPU variant", "CPU revision")]
    return f"arm/{'.'.join(arm)}" if arm[0] else ""


@functools.cache
def host_facts() -> HostFacts:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", cpuinfo)
    mhz = re.search(r"cpu MHz\s*:\s*([\d.]+)", cpuinfo)
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem = re.search(r"MemTotal:\s*(\d+)", meminfo)
    wanted = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd")
    try:
        tvm_version = metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        tvm_version = "unknown"
    return HostFacts(
        hostname=platform.node(),
        cpu_model=model.group(1).strip() if model else platform.processor() or "unknown",
        cores=len(os.sched_getaffinity(0)),
        mhz=float(mhz.group(1)) if mhz else float("nan"),
        l1d_kb=_cache_kb(1, ("Data",)),
        l2_kb=_cache_kb(2, ("Unified",)),
        l3_kb=_cache_kb(3, ("Unified",)),
        mem_gb=round(int(mem.group(1)) / 2**20, 1) if mem else float("nan"),
        isa=tuple(f for f in wanted if f in cpu_flags()),
        tvm_version=tvm_version,
        l1d_ways=_l1d_ways(),
        cpu_id=cpu_identity(cpuinfo),
    )
