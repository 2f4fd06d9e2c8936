"""Imported models on disk, so workers and later runs read a model's fused module and PrimFuncs without
building and importing the model again: ``mlflow/models/<model>-b<batch>-s<seq_len>-p<pipeline>-<made by>/``
(``$OPBENCH_MODEL_CACHE`` instead of ``mlflow/models`` when set; ``made by``: a digest of the libraries and model
code that made it) holds ``<func>.json`` (TVM's JSON) and ``ops.json`` (kind, calls, outputs, shapes, FLOPs and
the last measured share of each), and the whole fused module with its example inputs and reference output
(docs/cli.md#import-cache)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opbench.exceptions import WorkloadError
from opbench.paths import safe_name, store_dir, write_private
from opbench.workloads.models.extract import PIPELINE_VERSION, FusedOp, fuse, fused_ops, import_model
from opbench.workloads.models.sources import ModelSource, load_model

INDEX = "ops.json"
MAX_FUSED_JSON_BYTES = 256 << 20  # a larger model (BERT-base: ~590 MB of JSON) is imported anew each time
_MADE_BY = ("sources.py", "hf.py", "zoo.py", "graph.py", "extract.py", "dynamic.py", "quantize.py")  # what builds,
# imports, quantizes and fuses a model


CACHE_ENV = "OPBENCH_MODEL_CACHE"  # another folder for the cache (workers inherit it)


def cache_dir(model: str, batch: int, seq_len: int) -> Path:
    """The model's folder: a new pipeline, an edited model file, other libraries or other model code (the
    operators a model:... workload names then differ under the same names) extract anew."""
    base = Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else store_dir() / "models"
    return base / safe_name(f"{model}{_content_key(model)}-b{batch}-s{seq_len}-p{PIPELINE_VERSION}-{_made_by()}")


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
    for op in ops:  # each file whole or absent for another process importing the same model at once
        write_private(folder / f"{safe_name(op.name)}.json", tvm.ir.save_json(funcs[op.name]).encode())
    write_private(folder / INDEX, json.dumps({op.name: asdict(op) for op in ops}, indent=1).encode())
    return folder


@dataclass(frozen=True)
class Imported:
    """A model imported and fused, with the example inputs and reference output it was checked with."""

    mod: Any  # the fused Relax module
    inputs: list[np.ndarray]
    reference: np.ndarray


def imported(source: ModelSource, batch: int, seq_len: int) -> Imported:
    """``source`` imported and fused: read from the cache when the same libraries and code made it before,
    else made (building the model) and cached when its JSON is at most :data:`MAX_FUSED_JSON_BYTES`."""
    import tvm

    named = str(source.onnx_path) if source.onnx_path else source.name  # an ONNX file: keyed by its content
    base = cache_dir(named, batch, seq_len) / "fused"
    module, arrays = base.with_suffix(".json"), base.with_suffix(".npz")
    with contextlib.suppress(OSError, ValueError, zipfile.BadZipFile):  # not cached (or cut short): made anew
        with np.load(arrays) as saved:
            count = len(saved.files) - 1
            inputs, reference = [saved[f"arg{i}"] for i in range(count)], saved["reference"]
        return Imported(tvm.ir.load_json(module.read_text()), inputs, reference)
    made = Imported(fuse(import_model(source)), source.numpy_inputs(), source.reference()[0])
    text = tvm.ir.save_json(made.mod)
    if len(text) <= MAX_FUSED_JSON_BYTES:
        module.parent.mkdir(parents=True, exist_ok=True)
        write_private(module, text.encode())
        buffer = io.BytesIO()
        np.savez(buffer, reference=made.reference, **{f"arg{i}": a for i, a in enumerate(made.inputs)})
        write_private(arrays, buffer.getvalue())  # last: its presence says the module is whole
    return made


@functools.cache
def _made_by() -> str:
    """A digest of what makes an imported model: torch, transformers, ONNX and TVM's versions and this package's
    model code."""
    digest = hashlib.sha256()
    for dist in ("torch", "transformers", "onnx", "apache-tvm"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            digest.update(f"{dist}={importlib.metadata.version(dist)};".encode())
    for name in _MADE_BY:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]


def extract(model: str, batch: int, seq_len: int) -> tuple[list[FusedOp], dict[str, Any], Any]:
    """Import and fuse the model (:func:`imported`): its ops, their PrimFuncs, and the fused Relax module."""
    mod = imported(load_model(model, batch, seq_len), batch, seq_len).mod
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
