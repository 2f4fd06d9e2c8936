"""Whole models as the frameworks a user would pick instead of TVM run them, each made a call for the library
worker to time: PyTorch eager (the catalogue model), zentorch (the same module through ``torch.compile`` with
AMD's backend), torch.compile (an AOTInductor package), ONNX Runtime (an ONNX file, CPU provider, every graph
optimisation, the worker's threads within an operator, one across) and OpenVINO (the same ONNX file, or a quantized
model's NNCF export, on its CPU plugin, fp32 where it is not int8, latency mode, one stream of the worker's threads)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opbench.measure.protocol import EAGER, INDUCTOR, ONNXRUNTIME, OPENVINO, TORCH_INT8, TORCH_SPARSE, ZENTORCH, ModelInput
from opbench.measure.worker._common import first_output, saved_inputs

Call = Callable[[], Any]


def model_call(req: ModelInput, threads: int, device: Any) -> tuple[Call, np.ndarray | None]:
    """One forward of the model as ``req.system`` runs it, with ``threads``, and the output to check it
    against (None for eager: it is the reference)."""
    if req.system in (EAGER, ZENTORCH, TORCH_SPARSE, TORCH_INT8):
        return _torch_module_call(req, device)
    arrays, expected = saved_inputs(req.inputs)
    if req.system == INDUCTOR:
        import torch

        runner = torch._inductor.aoti_load_package(req.library)
        tensors = [torch.from_numpy(a).to(device) for a in arrays]
        return (lambda: runner(*tensors)), expected
    if req.system == ONNXRUNTIME:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(req.library, options, providers=["CPUExecutionProvider"])
        feed = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
        return (lambda: session.run(None, feed)), expected
    if req.system == OPENVINO:
        return _openvino_call(req.library, arrays, threads), expected
    raise ValueError(f"no framework runs '{req.system}' models")


def _torch_module_call(req: ModelInput, device: Any) -> tuple[Call, np.ndarray | None]:
    """The catalogue model eagerly (its own reference), or compiled by zentorch, or its sparse form eagerly,
    checked against eager."""
    from opbench.workloads.models.sources import load_model

    source = load_model(req.model, req.batch, req.seq_len)
    if not source.has_module:
        raise ValueError(f"{req.model} has no PyTorch module to run")
    module, inputs = source.module.to(device), [x.to(device) for x in source.inputs]
    if req.system == EAGER:
        return (lambda: module(*inputs)), None
    expected = first_output(module(*inputs))
    if req.system == TORCH_SPARSE:
        if not hasattr(module, "sparse_form"):
            raise ValueError(f"{req.model} has no sparse form")
        sparse = module.sparse_form()
        return (lambda: sparse(*inputs)), expected
    import torch

    if req.system == TORCH_INT8:  # as PyTorch's users quantize a transformer for CPUs (x86 backend, per tensor)
        quantized = torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8)
        return (lambda: quantized(*inputs)), expected
    import zentorch  # noqa: F401 - registers the backend

    compiled = torch.compile(module, backend="zentorch")
    return (lambda: compiled(*inputs)), expected


def openvino_config(threads: int) -> dict[str, str]:
    """OpenVINO's CPU plugin as its row runs: fp32 inference (it would pick bf16 by itself where the CPU has it; a
    quantized model's int8 layers stay int8), latency mode, one stream of ``threads`` threads."""
    return {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
            "INFERENCE_NUM_THREADS": str(threads)}


def _openvino_call(onnx_path: str, arrays: list[np.ndarray], threads: int) -> Call:
    """The ONNX file compiled by OpenVINO for the CPU (:func:`openvino_config`)."""
    import openvino as ov

    compiled = ov.Core().compile_model(onnx_path, "CPU", openvino_config(threads))
    request = compiled.create_infer_request()

    def call() -> Any:
        request.infer(arrays)
        return request.get_output_tensor(0).data

    return call
