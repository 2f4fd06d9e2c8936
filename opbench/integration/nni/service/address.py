"""Where a measurement service listens and the key that admits its clients (no TVM, torch or MLflow here).

One service per user and MLflow store: the socket lives in the user's private folder
(:func:`opbench.paths.user_runtime_dir`, owner and mode checked), named by a hash of the store's URI,
so two stores or two users never share a service. Its files are opened without following links.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path

from opbench.exceptions import UnsafePathError
from opbench.paths import default_tracking_uri, open_nofollow, private_dir, user_runtime_dir, write_private

DIR_ENV = "OPBENCH_SERVICE_DIR"  # another folder for the sockets (tests use a private one); checked the same way


def service_dir() -> Path:
    explicit = os.environ.get(DIR_ENV)
    return private_dir(Path(explicit)) if explicit else user_runtime_dir()


def socket_path(tracking_uri: str | None) -> Path:
    """The socket of the service that records to ``tracking_uri`` (default: the default store)."""
    uri = tracking_uri or default_tracking_uri()
    return service_dir() / f"{hashlib.sha256(uri.encode()).hexdigest()[:16]}.sock"


def authkey(socket: Path, create: bool = False) -> bytes:
    """The secret beside ``socket``, readable by its user only. The server creates it atomically: a
    new file of mode 0600 renamed over the old one, so no reader ever sees it half written."""
    path = socket.with_suffix(".key")
    if create:
        write_private(path, secrets.token_bytes(32))
    fd = open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as key:
        info = os.fstat(key.fileno())
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UnsafePathError(f"refusing key {path}: uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}")
        return key.read()


def open_private(path: Path, mode: str) -> int:
    """A file descriptor of ``path`` in the service folder (``"w"`` truncates, ``"a"`` appends, 0600)."""
    flags = {"w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND}[mode]
    return open_nofollow(path, flags)
