"""Runners: the interface (:class:`Runner`), the local runner (worker processes on this host), the RPC
runner (sessions on a tracker's devices) and the co-run runner."""
from __future__ import annotations

from opbench.measure.runner._base import Runner
from opbench.measure.runner.corun import CoRunner
from opbench.measure.runner.local import LocalRunner
from opbench.measure.runner.rpc import RPCRunner

__all__ = ["Runner", "LocalRunner", "RPCRunner", "CoRunner"]
