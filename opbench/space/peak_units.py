"""The peak a record's ``peak_frac`` divides by, per dtype: the fastest unit the host has for it, as a kernel the
runner times (docs/measurement.md#peak). fp32: chains of vector FMAs (:mod:`opbench.hardware.peak`); int8 and bf16:
AMX tiles where the CPU has them (:mod:`opbench.space.amx`), else its dot-product instruction
(:mod:`opbench.space.dot_product`)."""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from opbench.hardware.peak import CHAINS, ITERATIONS, peak_flops, vector_lanes
from opbench.hardware.peak import peak_kernel as fma_peak_kernel
from opbench.space import amx, dot_product
from opbench.workloads._base import ACCUMULATOR, LOW_PRECISION


@dataclass(frozen=True)
class PeakKernel:
    """A peak kernel: the unit it measures (the CPU flag of its instruction, ``fma`` for fp32's), its PrimFunc (built
    on demand: TVM loads only where it runs), the shape and element type of each of its two buffers, and the
    operations (a multiply and an add per product) of one call."""

    unit: str
    build: Callable[[], Any]
    shape: tuple[int, ...]
    dtype: str
    work: float


def peak_of(dtype: str, isa: Collection[str], threads: int) -> PeakKernel | None:
    """The peak kernel of ``dtype`` on a CPU with ``isa`` flags at ``threads`` (None: no peak of it is measured)."""
    if dtype in LOW_PRECISION and amx.AMX_FLAG in isa:
        return PeakKernel(amx.AMX_FLAG, lambda: amx.peak_kernel(dtype, threads), (threads, amx.PEAK_WORDS), "int32",
                          amx.peak_work(dtype, threads))
    dot = dot_product.instruction(dtype, frozenset(isa))
    if dot is not None:
        return PeakKernel(dot.isa, lambda: dot_product.peak_kernel(dot, threads), (threads, CHAINS, dot.lanes),
                          ACCUMULATOR[dtype], 2.0 * threads * CHAINS * ITERATIONS * dot.lanes * dot.group)
    if dtype == "float32":
        lanes = vector_lanes(tuple(isa))
        return PeakKernel("fma", lambda: fma_peak_kernel(threads, lanes), (threads, CHAINS, lanes), dtype,
                          peak_flops(threads, lanes))
    return None
