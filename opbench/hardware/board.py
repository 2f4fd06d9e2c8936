"""Board side: ``opbench board serve`` runs TVM's RPC server and registers OpBench's functions in it.

The functions let a client read the board's hardware facts (for features and peak throughput) and
its energy meter (PYNQ power rails, or RAPL on an x86 server) around each timed run. A plain
``python -m tvm.exec.rpc_server`` works too; its trials then carry no board facts and no energy.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading

BOARD_INFO = "opbench.board.info"


def register_functions() -> None:
    """Register the board functions in this process; TVM's server forks its sessions from it."""
    import tvm_ffi

    from opbench.hardware.energy import ENERGY_START, ENERGY_STOP, local_meter
    from opbench.hardware.resources import host_facts

    meter = local_meter(gpu=False)

    @tvm_ffi.register_global_func(BOARD_INFO, override=True)
    def info() -> str:
        facts = dataclasses.asdict(host_facts())
        return json.dumps({**facts, "energy": meter.source if meter else ""})

    @tvm_ffi.register_global_func(ENERGY_START, override=True)
    def energy_start() -> bool:
        if meter is None:
            return False
        meter.start()
        return True

    @tvm_ffi.register_global_func(ENERGY_STOP, override=True)
    def energy_stop() -> float:
        joules = meter.stop() if meter is not None else None
        return -1.0 if joules is None else joules


def serve(tracker: tuple[str, int], key: str, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, registered at ``tracker`` under ``key``; the server's children go too."""
    from tvm import rpc

    log = logging.getLogger("opbench")
    if os.geteuid() == 0:
        log.warning("serving as root: whoever reaches %s:%d runs code as root; run it as an unprivileged user "
                    "in the groups that own the board's devices", host, port)
    log.warning("TVM RPC is unauthenticated and loads any uploaded library: anyone who reaches %s:%d and the "
                "tracker runs code on this machine; serve only on a network you trust", host, port)
    server = rpc.Server(host=host, port=port, port_end=port + 100, tracker_addr=tracker, key=key,
                        server_init_callback=register_functions)
    log.info("serving key '%s' on %s:%d, registered at tracker %s:%d (pid %d)", key, host,
                                      server.port, tracker[0], tracker[1], os.getpid())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.terminate()
