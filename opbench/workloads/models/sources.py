"""Model sources: a name (or an ONNX file) -> a torch module with example inputs, or an ONNX model.

``torch``: plain modules written here (LSTM, GRU, a small CNN); ``simple:WORKLOAD``: one catalogue
workload's PyTorch implementation. ``transformers``: built from
configs with random weights (no hub access), each with a ``@tiny`` variant (few layers, small
hidden size) for tests. ``onnx``: any ``.onnx`` file, through Relax's ONNX frontend.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opbench.exceptions import OpBenchError
from opbench.workloads.models.quantize import is_quantized, quantized_suffix, unquantized
from opbench.workloads.models.zoo import ZOO

if TYPE_CHECKING:
    from opbench.workloads import Workload

TINY = "@tiny"


@dataclass(frozen=True)
class DynamicAxis:
    """A model's dynamic dimension, its sequence length or its batch: its axis in each input (``inputs``) and in
    its first output (``output``), at most ``max_size`` (a token model's position embeddings)."""

    name: str  # "seq_len" or "batch": the ModelSpec field (and --seq-len / --batch-size) that sizes it
    inputs: tuple[int, ...]
    output: int
    max_size: int

    @property
    def noun(self) -> str:
        """What one size of it is called: a length or a batch."""
        return "length" if self.name == "seq_len" else "batch"

    @property
    def tag(self) -> str:
        """Its letter in names of things built at one size of it: ``s128``, ``b16``."""
        return self.name[0]


TOKENS = DynamicAxis("seq_len", (1, 1), 1, 512)  # token ids and attention mask: a token model's sequence length
BATCH = DynamicAxis("batch", (0,), 0, 4096)  # the leading axis of a model's one input and of its first output


@dataclass
class ModelSource:
    """A model by name: its module (None for ONNX) and example inputs are made by ``build`` when first asked
    for, with torch's generator seeded, so a name means one set of weights in every process."""

    name: str
    kind: str  # "torch", "simple", "transformers" or "onnx"
    build: Callable[[], tuple[Any, tuple[Any, ...]]]  # (torch.nn.Module or None, inputs: tensors or numpy arrays)
    onnx_path: Path | None = None
    dynamic_axis: DynamicAxis | None = None  # its dynamic dimension, if it has one
    dims: dict[str, int] = field(default_factory=dict)  # an ONNX graph's named dimensions: their sizes here

    @functools.cached_property
    def _built(self) -> tuple[Any, tuple[Any, ...]]:
        if self.kind == "onnx":
            return self.build()
        import torch

        torch.manual_seed(0)
        module, inputs = self.build()
        return module.eval(), inputs

    @property
    def module(self) -> Any:
        """The torch.nn.Module (torch, simple, transformers; None for ONNX)."""
        return self._built[0]

    @property
    def inputs(self) -> tuple[Any, ...]:
        return self._built[1]

    def dynamic(self) -> DynamicAxis:
        """Its dynamic dimension; an error for a model without one."""
        if self.dynamic_axis is None:
            raise OpBenchError(f"model '{self.name}' has no dynamic dimension (a sequence length or a batch)")
        return self.dynamic_axis

    def dynamic_size(self) -> int:
        """The size of its dynamic dimension in its example inputs (a tiny model's sequences are cut short)."""
        return int(np.shape(self.inputs[0])[self.dynamic().inputs[0]])

    @property
    def has_module(self) -> bool:
        """Whether it is a PyTorch module (known without building it)."""
        return self.kind != "onnx"

    def numpy_inputs(self) -> list[np.ndarray]:
        return [np.asarray(t.numpy() if hasattr(t, "numpy") else t) for t in self.inputs]

    def reference(self, arrays: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """The model's outputs on ``arrays`` (default: its example inputs): torch eager, or ONNX's reference
        evaluator."""
        arrays = self.numpy_inputs() if arrays is None else arrays
        if self.kind == "onnx":
            from onnx.reference import ReferenceEvaluator

            evaluator = ReferenceEvaluator(str(self.onnx_path))
            names = [i.name for i in evaluator.proto_.graph.input]
            return [np.asarray(o) for o in evaluator.run(None, dict(zip(names, arrays)))]
        import torch

        with torch.no_grad():
            outputs = self.module(*map(torch.from_numpy, arrays))
        return [o.numpy() for o in (outputs if isinstance(outputs, (tuple, list)) else (outputs,))]


@dataclass(frozen=True)
class OnnxShapes:
    """An ONNX graph's inputs made concrete: random arrays, the sizes its named (dynamic) dimensions were given,
    and its sequence length where every input and the first output have one."""

    inputs: tuple[np.ndarray, ...]
    dims: dict[str, int]
    seq_axis: DynamicAxis | None


def _onnx_shapes(path: Path, batch: int, seq_len: int) -> OnnxShapes:
    """Random inputs for an ONNX graph's inputs (initializers are weights): a named dimension that leads an
    input is the batch (``batch``), one named dimension elsewhere the sequence length (``seq_len``); integer
    inputs 0 or 1 (valid indices, an attention mask)."""
    try:
        import onnx
    except ImportError as exc:
        raise OpBenchError("ONNX models need the 'onnx' package: pip install onnx") from exc
    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:
        raise OpBenchError(f"{path}: not a readable ONNX model: {exc}") from exc
    weights = {i.name for i in graph.initializer}
    values = [v for v in graph.input if v.name not in weights]
    dims: dict[str, int] = {}
    rng, out, seq_dims = np.random.default_rng(0), [], []
    for value in values:
        tensor = value.type.tensor_type
        shape = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.dim_value > 0:
                shape.append(dim.dim_value)
                continue
            if not dim.dim_param:
                raise OpBenchError(f"{path}: input '{value.name}' has an unnamed dynamic dimension {axis}; name it "
                                   "(the batch leading an input, a sequence length elsewhere) or give it a size")
            size = batch if axis == 0 else seq_len
            if dims.setdefault(dim.dim_param, size) != size:
                raise OpBenchError(f"{path}: dimension '{dim.dim_param}' leads one input and not another: it is "
                                   "neither the batch nor the sequence length alone")
            if axis:
                seq_dims.append((value.name, dim.dim_param, axis))
            shape.append(size)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        draw = rng.standard_normal(shape) if np.dtype(dtype).kind == "f" else rng.integers(0, 2, shape)
        out.append(draw.astype(dtype))
    names = sorted({name for _, name, _ in seq_dims})
    if len(names) > 1:
        raise OpBenchError(f"{path}: dynamic dimensions {', '.join(names)} besides the batch; one (the sequence "
                           "length, --seq-len) is bound at import: give the others sizes")
    return OnnxShapes(tuple(out), dims, _onnx_seq_axis(graph, values, seq_dims))


def _onnx_seq_axis(graph: Any, values: list[Any], seq_dims: list[tuple[str, str, int]]) -> DynamicAxis | None:
    """The sequence axis of each input and of the first output, where each has it (None otherwise)."""
    axes = {name: axis for name, _, axis in seq_dims}
    if not seq_dims or len(axes) != len(values):
        return None
    name = seq_dims[0][1]
    output = [d.dim_param for d in graph.output[0].type.tensor_type.shape.dim]
    if name not in output:
        return None
    return DynamicAxis("seq_len", tuple(axes[v.name] for v in values), output.index(name), max_size=1 << 20)


def _recurrent(tiny: bool, batch: int, seq: int, cell: str) -> tuple[Any, tuple[Any, ...]]:
    """An LSTM or GRU written out gate by gate (matmuls and elementwise ops), unrolled over time:
    what torch.export and Relax see of a recurrent layer, and what TVM's fused operators cover."""
    import torch

    hidden = 32 if tiny else 256
    gates = 4 if cell == "lstm" else 3

    class Recurrent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.x_proj = torch.nn.Linear(hidden, gates * hidden)
            self.h_proj = torch.nn.Linear(hidden, gates * hidden)
            self.head = torch.nn.Linear(hidden, 10)

        def step(self, x: Any, h: Any, c: Any) -> tuple[Any, Any]:
            if cell == "lstm":
                i, f, g, o = (self.x_proj(x) + self.h_proj(h)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                return torch.sigmoid(o) * torch.tanh(c), c
            xr, xz, xn = self.x_proj(x).chunk(3, dim=-1)
            hr, hz, hn = self.h_proj(h).chunk(3, dim=-1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            return (1 - z) * torch.tanh(xn + r * hn) + z * h, c

        def forward(self, x: Any) -> Any:
            h = c = torch.zeros(x.shape[0], hidden)
            for t in range(x.shape[1]):
                h, c = self.step(x[:, t], h, c)
            return self.head(h)

    return Recurrent(), (torch.randn(batch, seq, hidden),)


def _small_cnn(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    width, size = (8, 16) if tiny else (32, 64)
    model = torch.nn.Sequential(  # a plain conv, then a MobileNet-style block: depthwise (stride 2) and pointwise
        torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(width, width, 3, stride=2, padding=1, groups=width), torch.nn.BatchNorm2d(width),
        torch.nn.ReLU(), torch.nn.Conv2d(width, 2 * width, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(2 * width, 10))
    return model, (torch.randn(batch, 3, size, size),)


UNBATCHED = ("gcn",)  # one graph, its nodes the rows: no batch dimension to make dynamic
TORCH_MODELS: dict[str, Callable[[bool, int, int], tuple[Any, tuple[Any, ...]]]] = {
    "lstm": lambda tiny, b, s: _recurrent(tiny, b, s, "lstm"),
    "gru": lambda tiny, b, s: _recurrent(tiny, b, s, "gru"),
    "small-cnn": _small_cnn,
    **ZOO,
}


SIMPLE_PREFIX = "simple:"


def _simple(workload: Workload) -> tuple[Any, tuple[Any, ...]]:
    """A single catalogue workload as a model: its PyTorch implementation on its inputs."""
    import torch

    fn = workload.op.torch_impl(workload.params)

    class Single(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return fn(*args)

    return Single(), tuple(torch.from_numpy(a) for a in workload.make_inputs())


def model_names() -> list[str]:
    """Every named model, each with its tiny variant (and ``simple:WORKLOAD`` for any catalogue workload)."""
    from opbench.workloads.models.hf import HF_MODELS

    return [n + variant for n in (*TORCH_MODELS, *HF_MODELS) for variant in ("", TINY)]


def model_imports(name: str) -> tuple[str, ...]:
    """The modules beside torch that building the named model imports, known without building it: a
    ``transformers`` model's modeling module (none for the others)."""
    from opbench.workloads.models.hf import HF_MODELS, hf_module

    base = name.removesuffix(TINY)
    return (hf_module(base),) if base in HF_MODELS else ()


def load_model(name: str, batch: int = 1, seq_len: int = 128) -> ModelSource:
    """The named model (``bert-base``, ``lstm@tiny``, ...) or an ONNX file, ready to import (an unknown name,
    a missing or unreadable file is an error now; the module is built when first used). An ONNX file's named
    dimensions take ``batch`` where they lead an input, ``seq_len`` elsewhere."""
    if batch < 1 or seq_len < 1:
        raise OpBenchError(f"--batch-size and --seq-len must be >= 1, got {batch} and {seq_len}")
    if is_quantized(name):  # the same model, its matrix products int8 once imported (opbench.workloads.models.quantize)
        plain = load_model(unquantized(name), batch, seq_len)
        return dataclasses.replace(plain, name=plain.name + quantized_suffix(name))
    if name.endswith(".onnx"):
        path = Path(name)
        if not path.is_file():
            raise OpBenchError(f"ONNX file not found: {name}")
        shapes = _onnx_shapes(path, batch, seq_len)
        return ModelSource(path.stem, "onnx", lambda: (None, shapes.inputs), onnx_path=path,
                           dynamic_axis=shapes.seq_axis, dims=shapes.dims)
    if name.startswith(SIMPLE_PREFIX):
        from opbench.workloads import parse_workload

        workload = parse_workload(name.removeprefix(SIMPLE_PREFIX))  # a malformed one fails here
        return ModelSource(name, "simple", lambda: _simple(workload))
    base, tiny = name.removesuffix(TINY), name.endswith(TINY)
    if base in TORCH_MODELS:
        build = TORCH_MODELS[base]
        return ModelSource(name, "torch", lambda: build(tiny, batch, min(seq_len, 8) if tiny else min(seq_len, 32)),
                           dynamic_axis=None if base in UNBATCHED else BATCH)
    from opbench.workloads.models.hf import HF_MODELS, build_hf, has_tokens

    if base in HF_MODELS:
        return ModelSource(name, "transformers", lambda: build_hf(base, tiny, batch, seq_len),
                           dynamic_axis=TOKENS if has_tokens(base) else BATCH)
    raise OpBenchError(f"unknown model '{name}'; models: {', '.join(model_names())}, simple:WORKLOAD, "
                       "or a path to an .onnx file")
