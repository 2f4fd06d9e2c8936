"""Extracted operators on disk, so workers and later runs read a model's fused PrimFuncs without
importing the model again: ``mlflow/models/<model>-b<batch>-s<seq_len>-p<pipeline>/<func>.json`` (TVM's JSON;
``$OPBENCH_MODEL_CACHE`` instead of ``mlflow/models`` when set)
plus ``ops.json`` (kind, calls, outputs, shapes, FLOPs and the last measured share of each)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from opbench.exceptions import WorkloadError
from opbench.paths import safe_name, store_dir
from opbench.workloads.models.extract import PIPELINE_VERSION, FusedOp, fuse, fused_ops, import_model
from opbench.workloads.models.sources import load_model

INDEX = "ops.json"


CACHE_ENV = "OPBENCH_MODEL_CACHE"  # another folder for the cache (workers inherit it)


def cache_dir(model: str, batch: int, seq_len: int) -> Path:
    """The model's folder: a new pipeline, or an edited model file, extracts anew."""
    base = Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else store_dir() / "models"
    return base / safe_name(f"{model}{_content_key(model)}-b{batch}-s{seq_len}-p{PIPELINE_VERSION}")


def _content_key(model: str) -> str:
    """``-<digest>`` of a model given as a file (an ``.onnx`` path), so the cache keys on its content."""
    path = Path(model)
    if not path.is_file():
        return ""
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return f"-{digest.hexdigest()[:16]}"


def save(model: str, batch: int, seq_len: int, ops: list[FusedOp], funcs: dict[str, Any]) -> Path:
    import tvm

    folder = cache_dir(model, batch, seq_len)
    folder.mkdir(parents=True, exist_ok=True)
    for op in ops:
        (folder / f"{safe_name(op.name)}.json").write_text(tvm.ir.save_json(funcs[op.name]))
    (folder / INDEX).write_text(json.dumps({op.name: asdict(op) for op in ops}, indent=1))
    return folder


def extract(model: str, batch: int, seq_len: int) -> tuple[list[FusedOp], dict[str, Any], Any]:
    """Import and fuse the model: its ops, their PrimFuncs, and the fused Relax module."""
    mod = fuse(import_model(load_model(model, batch, seq_len)))
    ops, funcs = fused_ops(mod)
    return ops, funcs, mod


def load_op(model: str, func: str, batch: int, seq_len: int) -> tuple[FusedOp, Any]:
    """One fused op and its PrimFunc, extracting (and caching) the model first when needed."""
    import tvm

    folder = cache_dir(model, batch, seq_len)
    if not (folder / INDEX).is_file():
        ops, funcs, _ = extract(model, batch, seq_len)
        save(model, batch, seq_len, ops, funcs)
    index = json.loads((folder / INDEX).read_text())
    if func not in index:
        raise WorkloadError(f"model '{model}' has no fused operator '{func}'; it has: {', '.join(index)}")
    entry = index[func]
    op = FusedOp(**{**entry, "shapes": [tuple(s) for s in entry["shapes"]]})
    return op, tvm.ir.load_json((folder / f"{safe_name(func)}.json").read_text())
