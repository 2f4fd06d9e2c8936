"""A whole model made ready for a worker to time (:class:`~opbench.measure.protocol.ModelInput`): its Relax
module exported as a library, its inputs and reference output saved beside it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from opbench.measure.worker._common import EXPECTED


def export_model(mod: Any, target: Any, path: Path) -> Path:
    """Build the Relax module for ``target`` and export it as a shared library a worker loads."""
    import tvm

    path.parent.mkdir(parents=True, exist_ok=True)
    tvm.compile(mod, target).export_library(str(path))
    return path


def save_inputs(inputs: list[np.ndarray], path: Path, expected: np.ndarray | None = None) -> Path:
    """The model's inputs (``arg0``, ``arg1``, ...) and, to check its first output against, ``expected``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"arg{i}": a for i, a in enumerate(inputs)}
    if expected is not None:
        arrays[EXPECTED] = expected
    np.savez(path, **arrays)
    return path
