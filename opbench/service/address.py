"""Where a measurement service listens and the key that admits its clients (no TVM, torch or MLflow here).

One service per user and MLflow store: the socket lives in a folder only the user can enter, named by
a hash of the store's URI, so two stores or two users never share a service.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from opbench.paths import default_tracking_uri

DIR_ENV = "OPBENCH_SERVICE_DIR"  # another folder for the sockets (tests use a private one)


def service_dir() -> Path:
    folder = Path(os.environ.get(DIR_ENV) or f"/tmp/opbench-service-{os.getuid()}")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def socket_path(tracking_uri: str | None) -> Path:
    """The socket of the service that records to ``tracking_uri`` (default: the default store)."""
    uri = tracking_uri or default_tracking_uri()
    return service_dir() / f"{hashlib.sha256(uri.encode()).hexdigest()[:16]}.sock"


def authkey(socket: Path, create: bool = False) -> bytes:
    """The secret beside ``socket`` (readable by its user only); the server creates it."""
    path = socket.with_suffix(".key")
    if create:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
    return path.read_bytes()
