"""Runners: the interface (:class:`Runner`), the local and RPC runners, and a factory from the device spec."""
from __future__ import annotations

from opbench import settings
from opbench.hardware.devices import parse_device
from opbench.hardware.resources import LOCAL
from opbench.measure.lock import HostLock
from opbench.measure.runner._base import Runner
from opbench.measure.runner.corun import CoRunner
from opbench.measure.runner.local import LocalRunner
from opbench.measure.runner.rpc import RPCRunner
from opbench.measure.types import RunInput, RunResult

__all__ = ["Runner", "LocalRunner", "RPCRunner", "CoRunner", "create_runner"]


def create_runner(device: str, timeout_s: float, lock: HostLock | None = None, slots: int = 1,
                  connect_timeout_s: float = settings.CONNECT_TIMEOUT_S) -> Runner[RunInput, RunResult]:
    """The runner for a device spec: ``local`` (worker processes on this host, timed under ``lock``) or
    ``rpc://HOST:PORT/KEY`` (``slots`` sessions on the key's devices)."""
    if device == LOCAL:
        return LocalRunner(timeout_s, lock)
    return RPCRunner(parse_device(device), slots, timeout_s, connect_timeout_s)
