"""Device specs: ``local`` or a TVM RPC tracker key, ``rpc://HOST:PORT/KEY``."""
from __future__ import annotations

import re
from dataclasses import dataclass

from opbench.exceptions import ResourceError

_SPEC = re.compile(r"^rpc://(?P<host>[^:/]+):(?P<port>\d+)/(?P<key>[\w.\-]+)$")


@dataclass(frozen=True)
class RemoteDevice:
    host: str
    port: int
    key: str

    @property
    def spec(self) -> str:
        return f"rpc://{self.host}:{self.port}/{self.key}"

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"


def parse_device(text: str) -> RemoteDevice:
    """``rpc://HOST:PORT/KEY`` into a :class:`RemoteDevice`; anything else is a clear error."""
    match = _SPEC.match(text)
    if not match:
        raise ResourceError(f"malformed device '{text}': use local or rpc://HOST:PORT/KEY")
    return RemoteDevice(match["host"], _port(match["port"], text), match["key"])


def parse_tracker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ResourceError(f"malformed tracker address '{text}': use HOST:PORT")
    return host, _port(port, text)


def _port(digits: str, where: str) -> int:
    port = int(digits)
    if not 1 <= port <= 65535:
        raise ResourceError(f"port {port} of '{where}' is not a TCP port (1-65535)")
    return port
