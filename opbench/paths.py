"""Where OpBench keeps its files: the default store folder and file-safe names."""
from __future__ import annotations

import os
import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def store_dir() -> Path:
    """The repository's ``mlflow/`` folder (or ``./mlflow`` when installed elsewhere)."""
    root = PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").exists() else Path.cwd()
    return root / "mlflow"


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else the sqlite store in :func:`store_dir`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store_dir() / 'mlflow.db'}"


def safe_name(text: str) -> str:
    """``text`` usable as a file name (workload specs hold ':' and ',')."""
    return re.sub(r"[^\w.-]+", "_", text)
