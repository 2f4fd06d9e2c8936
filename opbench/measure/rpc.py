"""Remote devices behind a TVM RPC tracker: tracker queries and sessions (the runner is runner/rpc.py)."""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from opbench.exceptions import ResourceError
from opbench.hardware.devices import RemoteDevice

TRACKER_TIMEOUT_S = 10.0

def _tracker_call(host: str, port: int, request: list[Any], reply_timeout_s: float | None = TRACKER_TIMEOUT_S) -> Any:
    """One request to the tracker over TVM's tracker protocol: connecting is bounded by
    :data:`TRACKER_TIMEOUT_S`, the reply by ``reply_timeout_s`` (None: no bound)."""
    from tvm.rpc import base

    try:
        sock = socket.create_connection((host, port), timeout=TRACKER_TIMEOUT_S)
    except OSError as exc:
        raise ResourceError(f"tracker {host}:{port} unreachable: {exc.strerror or exc}") from exc
    with sock:
        try:
            sock.settimeout(reply_timeout_s)
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise ResourceError(f"{host}:{port} is not a TVM RPC tracker")
            base.sendjson(sock, request)
            return base.recvjson(sock)
        except OSError as exc:  # socket.timeout included
            raise ResourceError(f"tracker {host}:{port} did not answer: {exc}") from exc


def tracker_summary(host: str, port: int) -> dict[str, Any]:
    from tvm.rpc import base

    code, summary = _tracker_call(host, port, [base.TrackerCode.SUMMARY])
    if code != base.TrackerCode.SUCCESS:
        raise ResourceError(f"tracker {host}:{port} refused a summary: {summary}")
    return summary


@dataclass(frozen=True)
class DeviceKey:
    """One key at a tracker: its servers, how many are free, how many requests wait for one."""

    key: str
    servers: tuple[str, ...]
    free: int
    pending: int

    @property
    def used(self) -> int:
        return len(self.servers) - self.free


def list_devices(host: str, port: int) -> list[DeviceKey]:
    summary = tracker_summary(host, port)
    servers: dict[str, list[str]] = {}
    for item in summary["server_info"]:
        key = item["key"].partition(":")[2]  # "server:pynq-z2" -> "pynq-z2"
        servers.setdefault(key, []).append(":".join(map(str, item["addr"])))
    queues = summary["queue_info"]
    keys = sorted(set(servers) | {k for k, q in queues.items() if q["pending"]})
    return [DeviceKey(k, tuple(sorted(servers.get(k, []))), queues.get(k, {}).get("free", 0),
                      queues.get(k, {}).get("pending", 0)) for k in keys]


def check_device(device: RemoteDevice) -> DeviceKey:
    """Fail early, naming the problem, when the tracker is down or has no device of the key."""
    keys = {k.key: k for k in list_devices(device.host, device.port)}
    if device.key not in keys or not keys[device.key].servers:
        known = ", ".join(keys) or "none"
        raise ResourceError(f"no device with key '{device.key}' at tracker {device.tracker} (keys there: {known})")
    return keys[device.key]


def request_session(device: RemoteDevice) -> tuple[Any, str]:
    """A session on a free device of the key and that server's HOST:PORT. Waits as long as all are
    busy: the tracker answers a request only when a device is free (the RPC runner bounds the wait by
    killing its client after ``connect_timeout_s``)."""
    from tvm import rpc
    from tvm.rpc import base

    check_device(device)
    code, value = _tracker_call(device.host, device.port, [base.TrackerCode.REQUEST, device.key, "", 1], None)
    if code != base.TrackerCode.SUCCESS:
        raise ResourceError(f"tracker {device.tracker} refused a {device.key} device: {value}")
    url, port, matchkey = value
    return rpc.connect(url, port, matchkey), f"{url}:{port}"
