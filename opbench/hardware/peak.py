"""The host's measured peak, what ``peak_frac`` divides by (docs/measurement.md#peak).

Nominal peaks are guesses: /proc/cpuinfo's MHz is the base clock, not the boost one, and how wide a core
runs a vector (AMD Zen 4 halves AVX-512, Zen 5 does not) differs from generation to generation, so a fast
kernel read up to 1.5x "peak". The peak here is measured: independent chains of vector FMAs, one thread per
core of the run, as many chains as hide the FMA latency on every core we know, and the fastest repeat of
them counts. It is measured once per device key, threads, cores and dtype, through the runner as any kernel
is, and kept in a private file; measured in a slow spell of a shared host it reads low, so a kernel that outruns
it has it measured again.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opbench.paths import read_json_map, user_runtime_dir, write_private

PEAKS_FILE = "peaks.json"
CHAINS = 12  # independent accumulators a thread keeps: 2 FMA pipes x a latency of 4-6 cycles, with room
ITERATIONS = 100_000  # FMA rounds of a call: ~0.2 ms a thread at 100 GFLOP/s
LANE_BYTES = {"avx512f": 64, "avx2": 32, "avx": 32}  # vector width by the widest ISA flag present (else 16: SSE, NEON)


def vector_lanes(isa: tuple[str, ...], dtype: str = "float32") -> int:
    """Lanes of ``dtype`` in the host's widest vector register."""
    width = next((bytes_ for flag, bytes_ in LANE_BYTES.items() if flag in isa), 16)
    return width // {"float32": 4, "float16": 2}[dtype]


def peak_flops(threads: int, lanes: int, chains: int = CHAINS, iterations: int = ITERATIONS) -> float:
    """FLOPs of one call of :func:`peak_kernel`: a multiply and an add per lane, chain, round and thread."""
    return 2.0 * threads * chains * lanes * iterations


def peak_kernel(threads: int, lanes: int, dtype: str = "float32", chains: int = CHAINS,
                iterations: int = ITERATIONS, step: Callable[[Any, Any, Any, Any], Any] | None = None) -> Any:
    """A PrimFunc whose every thread runs ``chains`` independent chains of ``lanes``-wide vectors of ``dtype`` in
    registers; its inputs seed them and its output keeps them live. Each link is ``step(acc, seed, thread,
    chain)``, the chain's next vector: by default an FMA (another instruction's chains: the int8 peak's)."""
    from tvm import tirx
    from tvm.script import tirx as T

    shape, vector = (threads, chains, lanes), f"{dtype}x{lanes}"

    def fma(acc: Any, seed: Any, t: Any, c: Any) -> Any:
        return (acc.vload([t, c, 0], vector) * tirx.Broadcast(tirx.const(0.999999, dtype), lanes)
                + tirx.Broadcast(tirx.const(1e-7, dtype), lanes))

    link = step or fma

    @T.prim_func
    def main(seed: T.Buffer(shape, dtype), out: T.Buffer(shape, dtype)) -> None:  # type: ignore[valid-type]
        acc = T.alloc_buffer(shape, dtype, scope="local")
        for t in T.parallel(threads):
            for c in T.unroll(chains):
                for lane in T.vectorized(lanes):
                    acc[t, c, lane] = seed[t, c, lane]
            for _ in range(iterations):
                for c in T.unroll(chains):
                    acc[t, c, T.ramp(0, 1, lanes)] = link(acc, seed, t, c)
            for c in T.unroll(chains):
                for lane in T.vectorized(lanes):
                    out[t, c, lane] = acc[t, c, lane]

    return main


class PeakCache:
    """Measured peaks (GFLOP/s) of this user's hosts by device key, threads, cores, dtype and the unit measured (a
    dtype's peak is its fastest unit's: a CPU's AMX tiles, else its dot-product instruction), in a private file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or user_runtime_dir() / PEAKS_FILE
        self._known: dict[str, float] = {}  # read or measured by this process: a trial's record reads no file
        self._raised: set[str] = set()  # keys measured again because a kernel outran them

    @staticmethod
    def key(device_key: str, threads: int, cores: str, dtype: str, unit: str) -> str:
        return f"{device_key}|{threads}|{cores}|{dtype}|{unit}"

    def get_or_measure(self, key: str, measure: Callable[[], float | None], reached: float = 0.0) -> float | None:
        """The peak kept under ``key``, else ``measure()``'s, kept when it succeeded (None: it did not). Where a
        kernel ``reached`` more than it, the peak was measured in a slow spell: it is measured again, once a
        process, and the higher of the two kept."""
        if key not in self._known:
            known = read_json_map(self.path).get(key)
            if not isinstance(known, (int, float)) or known <= 0:
                known = measure()
                if known is None or known <= 0:
                    return None
                self._keep(key, known)
            self._known[key] = float(known)
        if reached > self._known[key] and key not in self._raised:
            self._raised.add(key)
            again = measure()
            if again is not None and again > self._known[key]:
                self._known[key] = again
                self._keep(key, again)
        return self._known[key]

    def _keep(self, key: str, peak: float) -> None:
        write_private(self.path, json.dumps({**read_json_map(self.path), key: peak}).encode())

