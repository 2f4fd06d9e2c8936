"""Whole models as operator sources: model definitions, import into Relax, fusion, and the fused-operator cache.

A layer above the catalogue: importing it registers where the catalogue's fused workloads
(:mod:`opbench.workloads.fused`) come from."""
from __future__ import annotations

from typing import Any

from opbench.workloads.fused import register_op_loader


def _load_op(model: str, func: str, batch: int, seq_len: int) -> tuple[Any, Any]:
    from opbench.workloads.models.cache import load_op  # TVM and the model libraries only when one is loaded

    return load_op(model, func, batch, seq_len)


register_op_loader(_load_op)
