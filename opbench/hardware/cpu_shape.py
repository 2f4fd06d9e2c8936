"""What shapes a CPU kernel's micro-kernel: the vector width and registers of the CPU it runs on, how wide its FMA
units run a vector, its L1 data cache's associativity and its L2's and last level's sizes. Read from the host (or a
board preset), never assumed from a vendor's name (the one exception, :data:`HALF_WIDTH_AVX512`, names CPU families by identity); template
defaults and schedule helpers read :func:`current_shape`, which a build for another target sets."""
from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from opbench.hardware.resources import HostFacts, host_facts
from opbench.hardware.targets import BOARDS

DEFAULT_L1D_WAYS = 8  # when the host does not say (a remote device's report, a non-Linux host)
DEFAULT_L2_KB = 512
DEFAULT_L3_KB = 8192
# CPUs (HostFacts.cpu_id prefixes) whose FMA units run a 512-bit vector as two 256-bit halves: AMD Zen 4 (family 25;
# Zen 5, family 26, runs it whole)
HALF_WIDTH_AVX512 = ("AuthenticAMD/25.",)


@dataclass(frozen=True)
class CpuShape:
    """A CPU's SIMD registers (width in bits, how many), its L1 data cache's ways, its L2's size, the ISA flags
    a template may choose an instruction by (``avx512_vnni``, ``avx2``), the width its FMA units run a vector
    at (``datapath_bits``; 0: the register's) and its last-level cache's size (``l3_kb``)."""

    vector_bits: int
    vector_registers: int
    l1d_ways: int = DEFAULT_L1D_WAYS
    l2_kb: float = DEFAULT_L2_KB
    isa: frozenset[str] = frozenset()
    datapath_bits: int = 0
    l3_kb: float = DEFAULT_L3_KB

    @property
    def fma_bits(self) -> int:
        """How wide a vector FMA is executed: per cycle and unit, the CPU multiplies-adds this many bits."""
        return self.datapath_bits or self.vector_bits

    @property
    def fp32_lanes(self) -> int:
        """float32 values in one vector register: a vectorised loop's natural length."""
        return self.vector_bits // 32

    @property
    def accumulator_registers(self) -> int:
        """Vector registers a register tile may hold as accumulators: half, the rest hold its operands."""
        return self.vector_registers // 2

    def accumulators_beside(self, operands: int) -> int:
        """Vector registers left as accumulators by a register tile whose step holds ``operands`` vectors of its own
        (a direct convolution's: its vectors of weights and the broadcast data value)."""
        return self.vector_registers - operands

    @classmethod
    def of(cls, facts: HostFacts) -> CpuShape:
        """The shape a CPU's ISA flags, caches and identity give (:meth:`of_isa`, :meth:`of_cpu`)."""
        shape = cls.of_isa(set(facts.isa), facts.l1d_ways or DEFAULT_L1D_WAYS,
                           facts.l2_kb if facts.l2_kb > 0 else DEFAULT_L2_KB)  # (NaN: not known)
        return replace(shape, l3_kb=facts.l3_kb if facts.l3_kb > 0 else DEFAULT_L3_KB).of_cpu(facts.cpu_id)

    def of_cpu(self, cpu_id: str) -> CpuShape:
        """This shape on the CPU ``cpu_id`` names (``HostFacts.cpu_id``, a device key's first part): its AVX-512 at
        half width where that is one of :data:`HALF_WIDTH_AVX512`."""
        half = self.vector_bits == 512 and cpu_id.startswith(HALF_WIDTH_AVX512)
        return replace(self, datapath_bits=256) if half else self

    @classmethod
    def of_isa(cls, isa: set[str], l1d_ways: int = DEFAULT_L1D_WAYS, l2_kb: float = DEFAULT_L2_KB) -> CpuShape:
        """AVX-512 32 x 512 bits, AVX/AVX2 16 x 256, AArch64 ASIMD 32 x 128, ARMv7 NEON and SSE 16 x 128."""
        flags = frozenset(isa)
        if "avx512f" in isa:
            return cls(512, 32, l1d_ways, l2_kb, flags)
        if isa & {"avx", "avx2"}:
            return cls(256, 16, l1d_ways, l2_kb, flags)
        return cls(128, 32 if "asimd" in isa else 16, l1d_ways, l2_kb, flags)


def record_shape(record: Mapping[str, Any]) -> CpuShape:
    """The shape of the CPU a record's kernel ran on: its board's (the record's target names the board's
    triple and CPU), else what the record's host features say (``feat.avx512``, ``feat.avx2``, an AArch64
    triple; its device key's CPU); this host's when the record says neither."""
    target = target_fields(record.get("target"))
    triple, mcpu = str(target.get("mtriple", "")), str(target.get("mcpu", ""))
    board = next((b for b in BOARDS.values() if (b.triple, b.mcpu) == (triple, mcpu)), None)
    if board is not None:
        return target_shape(board.name)
    if "feat.avx2" not in record and not triple:
        return CpuShape.of(host_facts())
    isa = {flag for flag, column in (("avx512f", "feat.avx512"), ("avx2", "feat.avx2")) if record.get(column) == 1.0}
    shape = CpuShape.of_isa(isa | ({"asimd"} if triple.startswith("aarch64") else set()))
    return shape.of_cpu(str(record.get("device_key") or ""))


def target_fields(target: Any) -> dict[str, Any]:
    """A record's ``target``: TVM's JSON of the target (a dict), else nothing to read."""
    try:
        fields = json.loads(target) if isinstance(target, str) else target
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


def target_shape(target: str, host: HostFacts | None = None) -> CpuShape:
    """The shape of the CPU that runs ``target``'s kernels: a board preset's, else ``host``'s (by default the shape
    in force: :func:`shaped_for`'s around this call, else this host's)."""
    board = BOARDS.get(target)
    if board is not None:
        return CpuShape(128, 32 if board.triple.startswith("aarch64") else 16, board.l1d_ways, board.l2_kb)
    return CpuShape.of(host) if host else current_shape()


_CURRENT: contextvars.ContextVar[CpuShape | None] = contextvars.ContextVar("opbench_cpu_shape", default=None)


def current_shape() -> CpuShape:
    """The shape set by :func:`shaped_for` around this call, else this host's."""
    return _CURRENT.get() or CpuShape.of(host_facts())


@contextlib.contextmanager
def shaped_for(target: str | CpuShape) -> Iterator[CpuShape]:
    """Template defaults and schedules within take ``target``'s shape (a target name or a shape)."""
    shape = target if isinstance(target, CpuShape) else target_shape(target)
    token = _CURRENT.set(shape)
    try:
        yield shape
    finally:
        _CURRENT.reset(token)
