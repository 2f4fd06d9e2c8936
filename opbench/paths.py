"""Where OpBench keeps its files: the default store folder and file-safe names."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

from opbench.exceptions import UnsafePathError
from opbench.lifecycle import process_alive

PROJECT_ROOT = Path(__file__).resolve().parents[1]
OPEN_DATASET_DIR = PROJECT_ROOT / "datasets" / "records"  # the open dataset kept in the repository (docs/datasets.md)


def store_dir() -> Path:
    """The repository's ``mlflow/`` folder (or ``./mlflow`` when installed elsewhere)."""
    root = PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").exists() else Path.cwd()
    return root / "mlflow"


def tuned_models_dir() -> Path:
    """Where ``tune-model --reuse`` keeps model tunings by default: :func:`store_dir`'s ``tuned-models``."""
    return store_dir() / "tuned-models"


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else the sqlite store in :func:`store_dir`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store_dir() / 'mlflow.db'}"


def safe_name(text: str) -> str:
    """``text`` usable as a file name (workload specs hold ':' and ',')."""
    return re.sub(r"[^\w.-]+", "_", text)


RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"


def user_runtime_dir() -> Path:
    """This user's private folder for sockets, keys and probe history: ``$XDG_RUNTIME_DIR/opbench`` when
    the session has one, else ``<tmp>/opbench-<uid>``; checked by :func:`private_dir`."""
    runtime = os.environ.get(RUNTIME_DIR_ENV)
    return private_dir(Path(runtime) / "opbench" if runtime else Path(tempfile.gettempdir()) / f"opbench-{os.getuid()}")


def build_dir() -> Path:
    """A new folder for this process's built kernels, in this user's private ``<tmp>/opbench-builds-<uid>``
    (not the runtime folder: a tmpfs that may forbid loading libraries); the folders of processes that ended
    without removing theirs (a killed study) are removed first."""
    builds = private_dir(Path(tempfile.gettempdir()) / f"opbench-builds-{os.getuid()}")
    for folder in builds.iterdir():
        owner = folder.name.split("-", 1)[0]
        if owner.isdigit() and not process_alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=builds))


def private_dir(folder: Path) -> Path:
    """``folder``, created with mode 0700 when missing; refused (:class:`UnsafePathError`) when it is a
    link, not a folder, not this user's, or writable by others: another user could plant or replace files in it."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=True)
    info = os.lstat(folder)
    problem = ("is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a folder" if not stat.S_ISDIR(info.st_mode)
               else f"belongs to uid {info.st_uid}, not {os.getuid()}" if info.st_uid != os.getuid()
               else f"has mode {stat.S_IMODE(info.st_mode):o}: others may write or enter it" if info.st_mode & 0o077
               else "")
    if problem:
        raise UnsafePathError(f"refusing {folder}: it {problem}; remove it (or set ${RUNTIME_DIR_ENV})")
    return folder


def open_nofollow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that never follows a symbolic link at ``path`` (a planted link fails with ELOOP)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def read_json_map(path: Path) -> dict[str, Any]:
    """The JSON object kept in ``path`` (by :func:`write_private`); empty when the file is missing, unreadable
    or holds anything else."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically with a new file of mode 0600 holding ``data``: a reader (another process
    of this user) sees the old file or the new one, never half of one, and never a planted link's target."""
    fresh = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    with os.fdopen(open_nofollow(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
        out.write(data)
    os.replace(fresh, path)
