"""Workarounds for Apache TVM 0.27 on CPU hosts (see STACK_NOTES.md)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types

_INTRIN = "tvm.s_tir.tensor_intrin"


def light_tensor_intrin() -> None:
    """Make ``import tvm.s_tir.tensor_intrin`` load only the x86 intrinsics.

    The real package imports every backend's intrinsics (CUDA alone takes ~16 s, all ~22 s here),
    and MetaSchedule's ``TuneContext`` imports it. A stub package with the real search path keeps
    the submodules importable on demand. Call it before anything touches MetaSchedule.
    """
    if _INTRIN in sys.modules:
        return
    spec = importlib.util.find_spec(_INTRIN)
    if spec is None or spec.submodule_search_locations is None:
        return
    stub = types.ModuleType(_INTRIN, "x86-only stand-in for tvm.s_tir.tensor_intrin (opbench)")
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__package__ = _INTRIN
    sys.modules[_INTRIN] = stub
    importlib.import_module(f"{_INTRIN}.x86")
