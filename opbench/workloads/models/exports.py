"""A model exported: ``torch.export``'s program (its sequence length a dynamic dimension where asked), Relax's
module of it or of an ONNX file (named dimensions symbolic), and, prepared once for the frameworks TVM is
compared with so that the fresh processes that time them only load them, torch.compile's ahead-of-time package
(AOTInductor) and an ONNX file for ONNX Runtime and OpenVINO."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from opbench.exceptions import OpBenchError
from opbench.workloads.models.calibrate import samples
from opbench.workloads.models.graph import integer_cumsum_widened
from opbench.workloads.models.quantize import STATIC_SUFFIX, is_quantized
from opbench.workloads.models.sources import ModelSource


def exported_program(source: ModelSource, dynamic: bool = False):  # -> torch.export.ExportedProgram
    """``torch.export`` of the model on its example inputs; ``dynamic``: its dynamic axis (a sequence length, a
    batch) a symbolic dimension, the same one in every input."""
    import torch

    if not source.has_module:
        raise OpBenchError(f"{source.name} has no PyTorch module to export")
    shapes = None
    if dynamic:
        axis = source.dynamic()
        symbol = torch.export.Dim(axis.name, min=2, max=axis.max_size)
        shapes = tuple({dim: symbol} for dim in axis.inputs)
    try:
        with torch.no_grad():
            return torch.export.export(source.module, source.inputs, dynamic_shapes=shapes)
    except Exception as exc:
        raise OpBenchError(f"model '{source.name}': torch.export failed: {str(exc).splitlines()[0]}") from exc


def relax_module(source: ModelSource, exported: Any) -> Any:
    """Relax's module of ``source``'s exported program, its weights bound as constants."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        return from_exported_program(integer_cumsum_widened(exported), unwrap_unit_return_tuple=True)
    except Exception as exc:
        raise OpBenchError(f"model '{source.name}': Relax cannot convert it: {str(exc).splitlines()[0]}") from exc


def onnx_module(source: ModelSource) -> Any:
    """Relax's module of an ONNX file, its named dimensions symbolic variables of those names."""
    try:
        import onnx
        from tvm.relax.frontend.onnx import from_onnx
    except ImportError as exc:
        raise OpBenchError("ONNX models need the 'onnx' package: pip install onnx") from exc
    try:
        return from_onnx(onnx.load(str(source.onnx_path)))
    except Exception as exc:
        raise OpBenchError(f"{source.onnx_path}: Relax's ONNX frontend cannot import it: {exc}") from exc


def inductor_package(source: ModelSource, path: Path, max_autotune: bool = False) -> Path:
    """``torch.compile`` of the model ahead of time (static shapes, inference, float32 as it is) as an
    AOTInductor package at ``path``; ``max_autotune`` lets Inductor time its GEMM choices."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(exported_program(source), package_path=str(path),
                                                 inductor_configs={"max_autotune": max_autotune})
    return path


def onnx_file(source: ModelSource, path: Path) -> Path:
    """The model exported to ONNX at ``path`` by torch's exporter (from ``torch.export``), weights inside; a quantized
    model then quantized by ONNX Runtime as its users do, as ours is: ``+int8`` by ``quantize_dynamic`` (i8 weights,
    u8 activations per tensor at run time), ``+int8-static`` by ``quantize_static`` (QDQ, i8 weights per channel, u8
    activations calibrated on the samples ours is calibrated on)."""
    if not is_quantized(source.name):
        return _fp32_onnx(source, path)
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    fp32 = _fp32_onnx(source, path.with_name(f"{path.stem}-fp32.onnx"))
    if source.name.endswith(STATIC_SUFFIX):
        class Samples(CalibrationDataReader):
            def __init__(self) -> None:
                self._left = iter(_calibration_feeds(fp32, source))

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._left, None)

        quantize_static(str(fp32), str(path), Samples(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    else:
        quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8)
    fp32.unlink()
    return path


def _calibration_feeds(onnx_path: Path, source: ModelSource) -> list[dict[str, np.ndarray]]:
    """The calibration samples of ``source`` (:func:`~opbench.workloads.models.calibrate.samples`) as feeds of its
    ONNX export's inputs."""
    import onnx

    model = onnx.load(str(onnx_path))
    weights = {w.name for w in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in weights]
    return [dict(zip(names, arrays)) for arrays in samples(source.numpy_inputs())]


def openvino_int8_file(source: ModelSource, path: Path) -> Path:
    """A quantized model (``+int8``) as OpenVINO's users make one: its fp32 ONNX export quantized by NNCF
    (post-training, static: activation ranges calibrated on the samples ours is calibrated on; a token model as a
    transformer, its attention's products left fp32), written at ``path`` with QuantizeLinear/DequantizeLinear
    pairs, which OpenVINO's CPU plugin runs as int8 operators."""
    import nncf
    import onnx

    fp32 = _fp32_onnx(source, path.with_name(f"{path.stem}-fp32.onnx"))
    feeds = _calibration_feeds(fp32, source)
    tokens = source.dynamic_axis is not None and source.dynamic_axis.name == "seq_len"
    kind = {"model_type": nncf.ModelType.TRANSFORMER} if tokens else {}
    quantized = nncf.quantize(onnx.load(str(fp32)), nncf.Dataset(feeds), subset_size=len(feeds), **kind)
    onnx.save(quantized, str(path))
    fp32.unlink()
    return path


def _fp32_onnx(source: ModelSource, path: Path) -> Path:
    """The fp32 model exported to ONNX at ``path`` by torch's exporter (from ``torch.export``), weights inside."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(exported_program(source), source.inputs, str(path), dynamo=True, external_data=False)
    return path
