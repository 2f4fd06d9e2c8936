"""Energy meters read around a timed run: CPU package energy (RAPL), GPU energy (NVML), board rails (PYNQ).

A meter is optional everywhere: where none can be read, trials carry no ``energy_j`` at all (never
a zero that would look like a measurement).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from opbench.exceptions import ResourceError

# Names of the board-side functions (registered by hardware.board) that read a board's energy counters.
ENERGY_START = "opbench.energy.start"
ENERGY_STOP = "opbench.energy.stop"

RAPL_ROOT = Path("/sys/class/powercap")


class EnergyMeter(Protocol):
    source: str

    def start(self) -> None: ...

    def stop(self) -> float | None:
        """Joules used since :meth:`start` (None when the reading failed)."""


class RaplMeter:
    """Sum of the CPU packages' RAPL energy counters (``intel-rapl:N/energy_uj``, also on AMD), wrap-aware."""

    source = "rapl"

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self._domains = [d for d in sorted(root.glob("intel-rapl:*")) if d.name.count(":") == 1]
        self._ranges = [int((d / "max_energy_range_uj").read_text()) for d in self._domains]
        self._begin: list[int] = []

    @classmethod
    def available(cls, root: Path = RAPL_ROOT) -> bool:
        try:
            meter = cls(root)
            return bool(meter._domains) and all(v >= 0 for v in meter._read())
        except (OSError, ValueError):
            return False

    def _read(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self._domains]

    def start(self) -> None:
        self._begin = self._read()

    def stop(self) -> float | None:
        end = self._read()
        micro = sum((e - b) % r if r else e - b for b, e, r in zip(self._begin, end, self._ranges))
        return micro * 1e-6


class NvmlMeter:
    """A GPU's total-energy counter through NVML (Volta and newer)."""

    source = "nvml"

    def __init__(self, index: int = 0) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._begin = 0

    @classmethod
    def available(cls) -> bool:
        try:
            cls().stop()
            return True
        except Exception:  # noqa: BLE001 - no library, no driver, no GPU or no counter: no meter
            return False

    def start(self) -> None:
        self._begin = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)

    def stop(self) -> float | None:
        return (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._begin) * 1e-3


class PynqRailsMeter:
    """Power rails of a PYNQ board (PMBus regulators, e.g. ZCU104), sampled while the kernel runs.

    Runs on the board, inside ``opbench board serve``; PYNQ-Z2 has no rail sensors, so there is no meter.
    """

    source = "pynq-rails"

    def __init__(self, interval_s: float = 0.01) -> None:
        import pynq

        rails = pynq.get_rails()
        self._sensors = [rail.power for rail in rails.values() if getattr(rail, "power", None) is not None]
        if not self._sensors:
            raise RuntimeError("this board exposes no power rails")
        self._recorder = pynq.DataRecorder(*self._sensors)
        self._interval_s = interval_s
        self._started = 0.0

    @classmethod
    def available(cls) -> bool:
        try:
            cls()
            return True
        except Exception:  # noqa: BLE001 - no pynq, no board, or a board without rail sensors
            return False

    def start(self) -> None:
        self._recorder.reset()
        self._recorder.record(self._interval_s)
        self._started = time.monotonic()

    def stop(self) -> float | None:
        self._recorder.stop()
        elapsed = time.monotonic() - self._started
        frame = self._recorder.frame
        if frame.empty:
            return None
        power_w = frame.drop(columns=[c for c in frame.columns if c == "Mark"]).sum(axis=1).mean()
        return float(power_w) * elapsed


class BoardMeter:
    """The meter of a board running ``opbench board serve``, read through an RPC session."""

    source = "board"

    def __init__(self, start: Any, stop: Any) -> None:
        self._start, self._stop = start, stop

    @classmethod
    def of(cls, session: Any) -> BoardMeter | None:
        try:
            start, stop = session.get_function(ENERGY_START), session.get_function(ENERGY_STOP)
            return cls(start, stop) if start() else None  # the board says whether it has a meter
        except Exception:  # noqa: BLE001 - a plain TVM rpc_server: no meter
            return None

    def start(self) -> None:
        self._start()

    def stop(self) -> float | None:
        joules = float(self._stop())
        return joules if joules >= 0 else None


def require_local_meter(gpu: bool) -> None:
    """Fail, naming what is missing, when kernels run here could not be given an ``energy_j``."""
    if local_meter(gpu) is None:
        raise ResourceError("energy needs a meter, and this host has none readable "
                            "(RAPL under /sys/class/powercap for CPUs, NVML for GPUs)")


def local_meter(gpu: bool) -> EnergyMeter | None:
    """The meter for kernels run in this process: NVML for a GPU, otherwise RAPL or a PYNQ board's rails."""
    if gpu:
        return NvmlMeter() if NvmlMeter.available() else None
    if RaplMeter.available():
        return RaplMeter()
    return PynqRailsMeter() if PynqRailsMeter.available() else None
