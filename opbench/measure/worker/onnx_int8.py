"""ONNX Runtime as an int8 operator's library reference: the workload as ONNX's integer node (``MatMulInteger``,
``ConvInteger``), u8 activations times i8 weights into i32 as OpBench's int8 workloads compute, on ONNX Runtime's
CPU provider with the run's threads. Its output is compared exactly with the integer reference before it is timed:
on a CPU without VNNI, ONNX Runtime's u8 x i8 product saturates its pairwise i16 sums (``vpmaddubsw``), so on
full-range inputs it is a wrong result there, said as such."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opbench.workloads import Workload

OPSET = 21
ONNX_NODES = {"matmul": "MatMulInteger", "batch_matmul": "MatMulInteger", "dense": "MatMulInteger",
              "conv2d": "ConvInteger"}


def int8_call(workload: Workload, arrays: list[np.ndarray], threads: int) -> Callable[[], Any]:
    """A call of ONNX Runtime computing ``workload`` (an int8 one of :data:`ONNX_NODES`) on ``arrays``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    p = workload.params
    names = ["x", "w", "bias"][: len(arrays)]
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for name, a in zip(names, arrays)]
    attrs = ({"strides": [p["stride"]] * 2, "pads": [p["pad"]] * 4, "dilations": [p["dilation"]] * 2}
             if workload.op.name == "conv2d" else {})
    nodes = [helper.make_node(ONNX_NODES[workload.op.name], ["x", "w"], ["y"], **attrs)]
    if len(arrays) == 3:  # a dense's i32 bias
        nodes.append(helper.make_node("Add", ["y", "bias"], ["out"]))
    output = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.INT32, None)
    model = helper.make_model(helper.make_graph(nodes, workload.name, inputs, [output]),
                              opset_imports=[helper.make_opsetid("", OPSET)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = dict(zip(names, arrays))
    return lambda: session.run(None, feed)[0]
