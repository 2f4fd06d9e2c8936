"""Dynamic dimensions: a token model's sequence length, another model's batch, an ONNX file's named dimensions.
The model is imported once with Relax's symbolic shapes (:func:`symbolic_module`) and bound to the sizes it is
built at (:func:`bound`): MetaSchedule and the templates tune static shapes, so a model serving many sizes is
built at a few, its *buckets*. At run time :class:`BucketedModel` dispatches: a size runs on the smallest bucket
that holds it, its inputs padded with zeros (a token model's mask too: the padding attends to nothing and nothing
attends to it; a padded image is a sample of its own), its (first) output cut back to the size."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opbench.exceptions import OpBenchError
from opbench.workloads.models.exports import exported_program, onnx_module, relax_module
from opbench.workloads.models.sources import DynamicAxis, ModelSource

log = logging.getLogger("opbench")

_SYMBOLIC: dict[tuple[str, tuple[int, ...]], Any] = {}  # (model, its first input's static sizes) -> symbolic module


def symbolic_module(source: ModelSource) -> Any:
    """Relax's module of the model with its dynamic dimensions symbolic (a token model's sequence length, another
    model's batch, an ONNX file's named dimensions), imported once per process for each model and set of static
    sizes (the weights are the same at every size: one seed)."""
    if source.kind == "onnx":
        shape: list[int] = []  # every named dimension symbolic: one import serves every size
    else:
        shape = list(np.shape(source.inputs[0]))
        shape[source.dynamic().inputs[0]] = -1
    key = (str(source.onnx_path or source.name), tuple(shape))
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
        sizes = {var.name: source.dynamic_size()}
    return relax.transform.BindSymbolicVars(sizes)(symbolic) if sizes else symbolic


@dataclass(frozen=True)
class Buckets:
    """The sizes a model is built at along its dynamic axis, ascending."""

    sizes: tuple[int, ...]
    axis: DynamicAxis

    def bucket_for(self, size: int) -> int:
        """The smallest bucket that holds ``size``."""
        for bucket in self.sizes:
            if bucket >= size:
                return bucket
        raise OpBenchError(f"{self.axis.noun} {size} is larger than the largest bucket ({self.sizes[-1]}); "
                           f"buckets: {', '.join(map(str, self.sizes))}")


def padded(arrays: Sequence[np.ndarray], axis: DynamicAxis, bucket: int) -> list[np.ndarray]:
    """The inputs padded with zeros along the dynamic axis up to ``bucket``."""
    out = []
    for array, dim in zip(arrays, axis.inputs):
        widths = [(0, 0)] * array.ndim
        widths[dim] = (0, bucket - array.shape[dim])
        out.append(np.pad(array, widths))
    return out


@dataclass(frozen=True)
class Dispatched:
    """One run of a bucketed model: its output at the inputs' size (a length or a batch), and the bucket that
    ran it."""

    output: np.ndarray
    size: int
    bucket: int
    noun: str  # the dynamic axis': length or batch

    def describe(self) -> str:
        if self.bucket == self.size:
            return f"{self.noun} {self.size} ran on its own bucket"
        return f"{self.noun} {self.size} ran on bucket {self.bucket} (padded {self.size} -> {self.bucket})"


class BucketedModel:
    """A model built at each of its buckets (a Relax VM library each), run at any size up to the largest."""

    def __init__(self, libraries: Mapping[int, Path], axis: DynamicAxis) -> None:
        import tvm
        from tvm import relax

        self.buckets, self.axis, self.libraries = Buckets(tuple(sorted(libraries)), axis), axis, dict(libraries)
        self._vms = {b: relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
                     for b, path in libraries.items()}

    def __call__(self, arrays: Sequence[np.ndarray]) -> Dispatched:
        import tvm

        size = arrays[0].shape[self.axis.inputs[0]]
        bucket = self.buckets.bucket_for(size)
        out = self._vms[bucket]["main"](*(tvm.runtime.tensor(a) for a in padded(arrays, self.axis, bucket)))
        while not hasattr(out, "numpy"):  # a tuple of outputs: the first
            out = out[0]
        output = np.take(out.numpy(), np.arange(size), axis=self.axis.output)
        return Dispatched(output, size, bucket, self.axis.noun)
