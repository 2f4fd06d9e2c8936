"""Dynamic dimensions: a token model's sequence length, an ONNX file's named dimensions. The model is
imported once with Relax's symbolic shapes (:func:`symbolic_module`) and bound to the sizes it is built at
(:func:`bound`): MetaSchedule and the templates tune static shapes, so a model serving many lengths is built at
a few, its *buckets*. At run time :class:`BucketedModel` dispatches: a length runs on the smallest bucket that
holds it, its inputs padded with zeros (a token model's mask too: the padding attends to nothing and nothing
attends to it), its (first) output cut back to the length."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opbench.exceptions import OpBenchError
from opbench.workloads.models.exports import exported_program, onnx_module, relax_module
from opbench.workloads.models.sources import ModelSource, SeqAxis

log = logging.getLogger("opbench")


def seq_len(source: ModelSource) -> int:
    """The sequence length of ``source``'s example inputs (a tiny model's are cut short)."""
    return int(np.shape(source.inputs[0])[source.sequence_axis().inputs[0]])


_SYMBOLIC: dict[tuple[str, int], Any] = {}  # (model, batch size) -> its symbolic module


def symbolic_module(source: ModelSource) -> Any:
    """Relax's module of the model with its dynamic dimensions symbolic (a token model's sequence length, an
    ONNX file's named dimensions), imported once per process for each model and batch size (the weights are the
    same at every length: one seed)."""
    key = (str(source.onnx_path or source.name), int(np.shape(source.inputs[0])[0]))
    if key not in _SYMBOLIC:
        log.info("%s: importing it once with its dynamic dimensions symbolic", source.name)
        _SYMBOLIC[key] = onnx_module(source) if source.kind == "onnx" else \
            relax_module(source, exported_program(source, dynamic=True))
    return _SYMBOLIC[key]


def bound(source: ModelSource) -> Any:
    """The model's symbolic module with its dynamic dimensions bound to ``source``'s sizes: a static module."""
    from tvm import relax

    symbolic = symbolic_module(source)
    if source.kind == "onnx":
        sizes = source.dims
    else:
        (var,) = relax.analysis.defined_symbolic_vars(symbolic["main"])
        sizes = {var.name: seq_len(source)}
    return relax.transform.BindSymbolicVars(sizes)(symbolic) if sizes else symbolic


@dataclass(frozen=True)
class Buckets:
    """The lengths a model is built at, ascending."""

    lengths: tuple[int, ...]

    def bucket_for(self, length: int) -> int:
        """The smallest bucket that holds ``length``."""
        for bucket in self.lengths:
            if bucket >= length:
                return bucket
        raise OpBenchError(f"length {length} is longer than the largest bucket ({self.lengths[-1]}); "
                           f"buckets: {', '.join(map(str, self.lengths))}")


def padded(arrays: Sequence[np.ndarray], axis: SeqAxis, bucket: int) -> list[np.ndarray]:
    """The inputs padded with zeros along the sequence axis up to ``bucket`` tokens."""
    out = []
    for array, dim in zip(arrays, axis.inputs):
        widths = [(0, 0)] * array.ndim
        widths[dim] = (0, bucket - array.shape[dim])
        out.append(np.pad(array, widths))
    return out


@dataclass(frozen=True)
class Dispatched:
    """One run of a bucketed model: its output at the inputs' length, and the bucket that ran it."""

    output: np.ndarray
    length: int
    bucket: int

    def describe(self) -> str:
        if self.bucket == self.length:
            return f"length {self.length} ran on its own bucket"
        return f"length {self.length} ran on bucket {self.bucket} (padded {self.length} -> {self.bucket})"


class BucketedModel:
    """A model built at each of its buckets (a Relax VM library each), run at any length up to the largest."""

    def __init__(self, libraries: Mapping[int, Path], axis: SeqAxis) -> None:
        import tvm
        from tvm import relax

        self.buckets, self.axis, self.libraries = Buckets(tuple(sorted(libraries))), axis, dict(libraries)
        self._vms = {b: relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
                     for b, path in libraries.items()}

    def __call__(self, arrays: Sequence[np.ndarray]) -> Dispatched:
        import tvm

        length = arrays[0].shape[self.axis.inputs[0]]
        bucket = self.buckets.bucket_for(length)
        out = self._vms[bucket]["main"](*(tvm.runtime.tensor(a) for a in padded(arrays, self.axis, bucket)))
        while not hasattr(out, "numpy"):  # a tuple of outputs: the first
            out = out[0]
        output = np.take(out.numpy(), np.arange(length), axis=self.axis.output)
        return Dispatched(output, length, bucket)
