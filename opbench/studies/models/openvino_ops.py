"""Where OpenVINO's time goes inside a model: its CPU plugin's own per-layer counters (``PERF_COUNT``), run as its
baseline row runs, each executed layer keyed by what it computes (:mod:`.eager_ops`' signatures, from the layer's
shapes and its ONNX node's attributes), so a model that misses its target shows the operators it loses to the
best baseline by, not only to eager. A diagnostic: its times are profiler times, never a verified claim."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from opbench.measure.worker.frameworks import openvino_config
from opbench.studies.models.eager_ops import OTHER, OpTime, Signature, conv_signature, conv_transpose_signature

CONVOLUTIONS = ("Convolution", "GroupConvolution", "Deconvolution")
PRODUCTS = ("FullyConnected", "MatMul", "Gemm")


def profile_openvino(onnx_path: Path | str, inputs: Sequence[Any], runs: int = 5, threads: int = 1) -> list[OpTime]:
    """OpenVINO's layers over ``runs`` calls of the ONNX file on ``inputs`` (arrays or tensors; after one warm-up),
    grouped by signature, ms per call."""
    import onnx
    import openvino as ov

    compiled = ov.Core().compile_model(str(onnx_path), "CPU", {**openvino_config(threads), "PERF_COUNT": "YES"})
    nodes = {node.name: node for node in onnx.load(str(onnx_path), load_external_data=False).graph.node}
    signatures = {op.get_friendly_name(): layer_signature(op, nodes.get(op.get_friendly_name()))
                  for op in compiled.get_runtime_model().get_ordered_ops()}
    request, arrays = compiled.create_infer_request(), [np.asarray(x) for x in inputs]
    request.infer(arrays)
    total_ms: dict[Signature, float] = defaultdict(float)
    for _ in range(runs):
        request.infer(arrays)
        for layer in request.profiling_info:
            total_ms[signatures.get(layer.node_name, OTHER)] += layer.real_time.total_seconds() * 1e3
    return [OpTime(sig, ms / runs) for sig, ms in total_ms.items()]


def layer_signature(op: Any, node: Any | None) -> Signature:
    """What a layer of OpenVINO's executed graph computes (its type, input and output shapes; a convolution's
    strides, padding and groups from the ONNX node it runs, ``node``, where the name is the node's)."""
    info = op.get_rt_info()
    kind = str(info["layerType"].astype(str)) if "layerType" in info else ""
    ports = [*op.inputs(), *op.outputs()]
    if op.get_output_size() == 0 or op.get_input_size() < 1 or not all(p.get_partial_shape().is_static for p in ports):
        return OTHER
    shapes = [list(op.input(i).get_shape()) for i in range(op.get_input_size())]
    out = list(op.output(0).get_shape())
    if kind in CONVOLUTIONS and len(shapes) > 1:
        return _convolution(shapes[0], shapes[1], out, node)
    if kind in PRODUCTS and len(out) >= 2:
        return ("gemm", math.prod(out[:-1]), out[-1], shapes[0][-1])
    if kind == "Softmax":
        return ("softmax", *shapes[0])
    return OTHER


def _convolution(data: list[int], weight: list[int], out: list[int], node: Any | None) -> Signature:
    """A convolution's signature: from its ONNX node's attributes where there is one (as eager's, including the
    forms our import rewrites 3-D and transposed convolutions to), else a 2-D one's from its shapes alone."""
    spatial = len(data) - 2
    kernel = weight[-spatial:]
    if node is not None and node.op_type in ("Conv", "ConvTranspose"):
        import onnx

        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        stride, dilation = attrs.get("strides", [1] * spatial), attrs.get("dilations", [1] * spatial)
        padding, groups = attrs.get("pads", [0] * 2 * spatial)[:spatial], attrs.get("group", 1)
        full = [weight[0] * weight[1], *weight[2:]] if len(weight) == len(data) + 1 else weight  # grouped: G, O/G, ...
        if node.op_type == "ConvTranspose" and spatial == 2:
            output_padding = attrs.get("output_padding", [0, 0])
            return conv_transpose_signature(data, [data[1], out[1] // groups, *kernel], stride, padding, output_padding,
                                            groups, dilation)
        if node.op_type == "Conv":
            return conv_signature(data, full, stride, padding, dilation, groups)
    if spatial == 2 and kernel == [1, 1] and out[2:] == data[2:] and len(weight) == len(data):  # stride 1, unpadded
        return conv_signature(data, weight, [1, 1], [0, 0], [1, 1])  # as eager's: maybe its pixels as one row
    return ("conv", *data[:2], out[1], *kernel, *out[2:]) if spatial == 2 else OTHER
