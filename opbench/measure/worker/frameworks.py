"""Whole models as the frameworks a user would pick instead of TVM run them, each made a call for the library
worker to time: PyTorch eager (the catalogue model), torch.compile (an AOTInductor package) and ONNX Runtime
(an ONNX file, CPU provider, every graph optimisation, the worker's threads within an operator, one across)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opbench.measure.protocol import EAGER, INDUCTOR, ONNXRUNTIME, ModelInput
from opbench.measure.worker._common import saved_inputs


def model_call(req: ModelInput, threads: int, device: Any) -> tuple[Callable[[], Any], np.ndarray | None]:
    """One forward of the model as ``req.system`` runs it, with ``threads``, and the output to check it
    against (None for eager: it is the reference)."""
    if req.system == EAGER:
        from opbench.workloads.models.sources import load_model

        source = load_model(req.model, req.batch, req.seq_len)
        if not source.has_module:
            raise ValueError(f"{req.model} has no PyTorch module to run eagerly")
        module, inputs = source.module.to(device), [x.to(device) for x in source.inputs]
        return (lambda: module(*inputs)), None
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
    raise ValueError(f"no framework runs '{req.system}' models")
