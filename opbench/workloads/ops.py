"""The operator catalogue: every operator by name (TE definitions imported lazily, references, axes, FLOPs)."""
from __future__ import annotations

from typing import Any

from opbench.workloads._base import Operator
from opbench.workloads.conv import Conv2d, DepthwiseConv2d, Pool2d
from opbench.workloads.conv3d import Conv3d
from opbench.workloads.conv_transpose import Conv2dTranspose
from opbench.workloads.fused import Fused
from opbench.workloads.linear import BatchMatMul, Dense, MatMul
from opbench.workloads.rowwise import AddRelu, LayerNorm, Softmax

OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (
        MatMul(), BatchMatMul(), Dense(), Conv2d(), DepthwiseConv2d(), Pool2d(), Conv3d(), Conv2dTranspose(), Softmax(), LayerNorm(), AddRelu(),
        Fused(),
    )
}

def parse_value(text: str) -> Any:
    """Integers stay integers; anything else (``kind=max``) stays a string."""
    try:
        return int(text)
    except ValueError:
        return text
