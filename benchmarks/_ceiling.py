"""The host's GEMM ceiling, measured in the run that quotes it: what a kernel's GFLOP/s are compared with,
instead of a peak derived from the CPU's name (which the host facts cannot tell for every vendor)."""
from __future__ import annotations

from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.workloads import parse_workload

CEILING = "matmul:m=2048,n=2048,k=2048"  # the faster of PyTorch's and numpy's fp32 GEMM on it


def gemm_ceiling(threads: int) -> tuple[float, str]:
    """GFLOP/s of the faster of PyTorch's and numpy's fp32 GEMM on :data:`CEILING` with ``threads`` threads,
    each the median of fresh processes, and which library it was."""
    workload = parse_workload(CEILING)
    with Measurer() as measurer:
        ms = {library: measurer.measure_library(workload, library, Resources(threads))["latency_ms"]
              for library in ("torch", "numpy")}
    fastest = min(ms, key=ms.__getitem__)
    return workload.flops / (ms[fastest] * 1e-3) / 1e9, fastest


def ceiling_line(ceiling: float, library: str) -> str:
    return (f"the host's GEMM ceiling: {library}'s {CEILING}, fp32, {ceiling:.1f} GFLOP/s (the faster of torch and "
            "numpy, each the median of 3 fresh processes)")
