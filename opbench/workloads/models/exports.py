"""A model prepared once for the frameworks TVM is compared with, so that the fresh processes that time it
only load it: torch.compile's ahead-of-time package (AOTInductor) and an ONNX file for ONNX Runtime."""
from __future__ import annotations

from pathlib import Path

from opbench.exceptions import OpBenchError
from opbench.workloads.models.sources import ModelSource


def _program(source: ModelSource):  # -> torch.export.ExportedProgram
    import torch

    if not source.has_module:
        raise OpBenchError(f"{source.name} has no PyTorch module to export")
    with torch.no_grad():
        return torch.export.export(source.module, source.inputs)


def inductor_package(source: ModelSource, path: Path, max_autotune: bool = False) -> Path:
    """``torch.compile`` of the model ahead of time (static shapes, inference, float32 as it is) as an
    AOTInductor package at ``path``; ``max_autotune`` lets Inductor time its GEMM choices."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(_program(source), package_path=str(path),
                                                 inductor_configs={"max_autotune": max_autotune})
    return path


def onnx_file(source: ModelSource, path: Path) -> Path:
    """The model exported to ONNX at ``path`` by torch's exporter (from ``torch.export``), weights inside."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(_program(source), source.inputs, str(path), dynamo=True, external_data=False)
    return path
