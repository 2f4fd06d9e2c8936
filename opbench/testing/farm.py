"""A board farm in one machine, for the remote-device tests: a real TVM RPC tracker and ``opbench board
serve`` servers of one key, each in its own process group (killed whole). All listen on 127.0.0.1, or,
given a :class:`~opbench.testing.lan.Network`, each on a host of its own: the tracker on ``tracker``,
server i on ``board-i``.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from opbench.hardware.devices import RemoteDevice
from opbench.measure.rpc import list_devices
from opbench.testing.lan import Network, free_port

CLI = [sys.executable, "-m", "opbench.cli"]
# TVM's tracker (``python -m tvm.exec.rpc_tracker``) with TVM imported after opbench: it and its pool worker start without torch
TRACKER = [sys.executable, "-c", "import opbench, runpy; runpy.run_module('tvm.exec.rpc_tracker', run_name='__main__')"]
KEY = "cpu-farm"
TRACKER_PORT, BOARD_PORT = 9190, 9090  # TVM's defaults: on hosts of their own, each has its ports to itself


class Farm:
    """A tracker and ``servers`` servers of key :data:`KEY`; ``network`` puts each on its own host."""

    def __init__(self, log_dir: Path, servers: int, network: Network | None = None) -> None:
        self.log = log_dir
        on: Callable[[str, list[str]], list[str]] = network.on if network else (lambda _host, argv: argv)
        host = network.address if network else (lambda _host: "127.0.0.1")
        self.host, self.port = host("tracker"), TRACKER_PORT if network else free_port()
        self.tracker = self._spawn(on("tracker", [*TRACKER, "--host", self.host,
                                                  "--port", str(self.port), "--port-end", str(self.port + 1)]), "tracker")
        self.servers: list[subprocess.Popen] = []
        self._wait(lambda: list_devices(self.host, self.port) is not None)
        self.servers = [self._spawn(on(f"board-{i}", CLI + ["board", "serve", "--tracker", self.address, "--key", KEY,
                                                            "--host", host(f"board-{i}"),
                                                            "--port", str(BOARD_PORT if network else free_port())]),
                                    f"board-{i}") for i in range(servers)]
        self._wait(lambda: sum(k.free for k in list_devices(self.host, self.port) if k.key == KEY) == servers)

    @property
    def remote(self) -> RemoteDevice:
        return RemoteDevice(self.host, self.port, KEY)

    @property
    def address(self) -> str:
        return self.remote.tracker

    @property
    def device(self) -> str:
        return self.remote.spec

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        with open(self.log / f"{name}.log", "w") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while True:
            dead = [p for p in [self.tracker, *self.servers] if p.poll() is not None]
            if dead:
                raise RuntimeError(f"RPC farm process exited: {dead[0].args!r}; logs in {self.log}")
            try:
                if ready():
                    return
            except Exception:
                if time.time() > deadline:
                    raise
            if time.time() > deadline:
                raise TimeoutError(f"RPC farm did not come up; logs in {self.log}")
            time.sleep(0.3)

    def server_addresses(self) -> list[str]:
        return [s for k in list_devices(self.host, self.port) if k.key == KEY for s in k.servers]

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in [*self.servers, self.tracker]:
            self.kill(proc)
