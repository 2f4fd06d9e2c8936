"""Workarounds for Apache TVM 0.27 on CPU hosts (see STACK_NOTES.md)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import subprocess
import sys
import types
from collections.abc import Sequence
from typing import Any

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


# TVM's optional uses of torch, imported at TVM's import whether or not the process needs them: tvm_ffi's (a
# workaround for a Windows symbol clash, its torch dtypes and DLPack extension) and Relax's BasePyModule's.
_TORCH_OPTIONAL_IN = ("tvm_ffi", "tvm.relax.base_py_module")


class _TorchLeftToItsUsers(importlib.abc.MetaPathFinder):
    """Refuses ``import torch`` to TVM's optional uses of it (they carry on without), not to anyone else."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torch" and _importer().startswith(_TORCH_OPTIONAL_IN):
            raise ModuleNotFoundError("torch is left to the code that uses it (opbench._tvm_compat)", name=name)
        return None


def _importer() -> str:
    """The module whose code runs the import being looked up (the first frame outside importlib's)."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def leave_torch_to_its_users() -> None:
    """Keep ``import tvm`` from importing torch in a process that does not use it (docs/measurement.md#process-start).

    A process that imports torch itself, before or after TVM, gets it whole: only TVM's optional uses go without.
    """
    if not any(isinstance(finder, _TorchLeftToItsUsers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchLeftToItsUsers())


_POOL, _POOL_WORKER = "tvm.support.popen_pool", "tvm.exec.popen_worker"
POOL_WORKER = "opbench._tvm_pool_worker"


class _PoolLauncher:
    """``subprocess`` as TVM's process pool module sees it: its workers start as :data:`POOL_WORKER`."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(cmd: Sequence[str], *args: Any, **kwargs: Any) -> subprocess.Popen:
        if list(cmd[1:3]) == ["-m", _POOL_WORKER]:
            cmd = [cmd[0], "-m", POOL_WORKER, *cmd[3:]]
        return subprocess.Popen(cmd, *args, **kwargs)


class _PoolWorkersStartLight(importlib.abc.MetaPathFinder):
    """Loads TVM's process pool module with :class:`_PoolLauncher` in place of ``subprocess``."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: object = None) -> Any:
        if name != _POOL:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module: types.ModuleType) -> None:
                execute(module)
                module.subprocess = _PoolLauncher()  # type: ignore[attr-defined]

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def light_pool_workers() -> None:
    """Have TVM's process pools (MetaSchedule's builders and runners, an RPC server's session process) start
    their workers as ``python -m opbench._tvm_pool_worker``: TVM's own ``tvm.exec.popen_worker`` imports TVM
    before anything can keep torch out of it (docs/measurement.md#process-start)."""
    if _POOL in sys.modules:
        sys.modules[_POOL].subprocess = _PoolLauncher()  # type: ignore[attr-defined]
    elif not any(isinstance(finder, _PoolWorkersStartLight) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PoolWorkersStartLight())
