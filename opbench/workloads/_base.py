"""Operator definitions and the :class:`Workload` (an operator with concrete shape keys)."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from opbench.exceptions import WorkloadError

if TYPE_CHECKING:
    from tvm import te

Params = dict[str, Any]
FLOAT_DTYPES = ("float32", "float16")
INT8 = "int8"  # u8 activations, i8 weights, i32 accumulation, bias and output (how CPUs' VNNI and oneDNN run it)
BF16 = "bfloat16"  # bf16 operands, fp32 accumulation, bias and output (AVX512-BF16's vdpbf16ps, AMX)
LOW_PRECISION = (INT8, BF16)
SUPPORTED_DTYPES = (*FLOAT_DTYPES, *LOW_PRECISION)
OPERANDS = {INT8: ("uint8", "int8", "int32"), BF16: (BF16, BF16, BF16)}  # activation, weight, further inputs (a bias)
ACCUMULATOR = {INT8: "int32", BF16: "float32"}
INT8_STEP = 4  # reduction steps an int8 dot-product instruction sums per lane (VNNI's 4; AVX2's pairs, two at a time)


def numpy_dtype(name: str) -> np.dtype:
    """numpy's dtype of a TVM type name (bfloat16 is ml_dtypes', which TVM converts through)."""
    if name == BF16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def widen(value: Any, dtype: str) -> Any:
    """A TE expression in ``dtype`` (unchanged where it is in it already): products accumulate in the output's type."""
    return value if value.dtype == dtype else value.astype(dtype)


@dataclass(frozen=True)
class Axis:
    """One loop of an operator's anchor block: name, extent and kind (spatial or reduce)."""

    name: str
    extent: int
    reduce: bool = False


class Operator(ABC):
    """One catalogue operator: its TE definition, reference, loop axes and cost."""

    name: ClassVar[str]
    keys: ClassVar[tuple[str, ...]]
    options: ClassVar[dict[str, Any]] = {}
    anchor: ClassVar[str]  # name of the TE block that does the main computation
    description: ClassVar[str] = ""
    dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES  # the element types it is defined for

    def check(self, p: Params) -> None:
        """Reject shape combinations that make no sense (raise WorkloadError)."""

    def kind(self, p: Params) -> str:
        """What the operator computes, as templates know it: its name (a model's fused operator
        names its anchor where a template knows it, e.g. ``fused_conv2d``)."""
        return self.name

    def pool_window(self, p: Params) -> str:
        """What its anchor is as a model's pooling window: "padded", "plain", or "" (none: here, and for every
        catalogue operator, whose pool2d has a template of its own)."""
        return ""

    @abstractmethod
    def input_shapes(self, p: Params) -> list[tuple[int, ...]]: ...

    @abstractmethod
    def output_shape(self, p: Params) -> tuple[int, ...]: ...

    def task_key(self, p: Params, dtype: str) -> str | None:
        """What the operator computes, independent of how it is named, when its spec does not say it
        (None: the spec does: op, keys in canonical order, layout options and dtype)."""
        return None

    def input_dtypes(self, p: Params, dtype: str) -> list[str]:
        """Each input's element type: the workload's (low precision: :data:`OPERANDS`), unless the op has integer
        inputs (indices)."""
        count = len(self.input_shapes(p))
        if dtype in LOW_PRECISION:
            activation, weight, bias = OPERANDS[dtype]
            return [activation, weight, *[bias] * (count - 2)][:count]
        return [dtype] * count

    def output_dtype(self, p: Params, dtype: str) -> str:
        return ACCUMULATOR.get(dtype, dtype)

    @abstractmethod
    def axes(self, p: Params) -> list[Axis]:
        """The anchor block's loops, in TE order (spatial first, then reduction)."""

    @abstractmethod
    def flops(self, p: Params) -> float: ...

    @abstractmethod
    def define(self, p: Params, dtype: str) -> list[te.Tensor]:
        """TE tensors: inputs then the output."""

    def prim_func(self, p: Params, dtype: str) -> Any:
        """The unscheduled TensorIR PrimFunc (from :meth:`define` unless the op is TIR already)."""
        from tvm import te

        return te.create_prim_func(self.define(p, dtype))

    @abstractmethod
    def torch_impl(self, p: Params) -> Callable[..., Any]:
        """PyTorch's implementation: a function of the input tensors (the library baseline)."""

    numpy_impl: ClassVar[bool] = False  # True when ``reference`` is plain numpy (a second baseline)
    torch_baseline: ClassVar[bool] = True  # False when there is no PyTorch implementation to time

    def has_pad_stage(self, p: Params) -> bool:
        """Whether :meth:`define` makes a stage named ``pad`` before the anchor (a window operator's, where it pads)."""
        return bool(p.get("pad"))

    def source_model(self, p: Params) -> str:
        """The model this operator comes from, when it is one of a model's own (presets name theirs)."""
        return ""

    def reference(self, arrays: list[np.ndarray], p: Params) -> np.ndarray:
        """The expected output for ``arrays`` (the inputs); PyTorch's unless overridden with numpy."""
        import torch

        with torch.no_grad():
            return self.torch_impl(p)(*(torch.from_numpy(a) for a in arrays)).numpy()


@dataclass(frozen=True)
class Workload:
    """An operator with all its keys bound, e.g. ``matmul:m=512,n=512,k=512``."""

    op: Operator
    params: dict[str, Any] = field(hash=False)
    dtype: str = "float32"
    preset: str | None = None  # its short name: a preset's, or a model operator's (model:NAME/FUNC)

    @property
    def shape(self) -> str:
        """The keys as ``k=v,...`` in the operator's canonical order."""
        order = list(self.op.keys) + list(self.op.options)
        return ",".join(f"{k}={self.params[k]}" for k in order)

    @property
    def spec(self) -> str:
        """Canonical spec string that :func:`opbench.workloads.parse_workload` reads back."""
        dtype = "" if self.dtype == "float32" else f",dtype={self.dtype}"
        return f"{self.op.name}:{self.shape}{dtype}"

    @property
    def name(self) -> str:
        return self.preset or self.spec

    @property
    def task_key(self) -> str:
        """The canonical task: one key for every name of the same computation (``matmul-512`` and
        ``matmul:m=512,n=512,k=512``; a model's operator and the same PrimFunc in another model)."""
        return self.op.task_key(self.params, self.dtype) or self.spec

    @property
    def flops(self) -> float:
        return float(self.op.flops(self.params))

    @property
    def bytes(self) -> float:
        """Bytes moved at least once: every input read and the output written."""
        shapes = [*self.op.input_shapes(self.params), self.op.output_shape(self.params)]
        dtypes = [*self.op.input_dtypes(self.params, self.dtype), self.output_dtype]
        return float(sum(math.prod(s) * numpy_dtype(d).itemsize for s, d in zip(shapes, dtypes)))

    @property
    def axes(self) -> list[Axis]:
        return self.op.axes(self.params)

    @property
    def kind(self) -> str:
        return self.op.kind(self.params)

    @property
    def output_dtype(self) -> str:
        return self.op.output_dtype(self.params, self.dtype)

    def make_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs: floats of magnitude in [0.5, 1), either sign (bf16: rounded to it; away from zero because
        a model operator divides by some of them, a batch norm's scale: a divisor drawn near zero amplifies two
        correct float32 results' rounding apart past any tolerance); an int8 workload's operands over their type's
        whole range (a bias: int16's); booleans 0 or 1; other integers 0 (an index valid in any dimension, a
        dimension of one too: BERT's mask is gathered at [0, position])."""
        rng = np.random.default_rng(seed)

        def draw(shape: tuple[int, ...], dtype: str) -> np.ndarray:
            if dtype == BF16 or np.dtype(dtype).kind == "f":
                signs = rng.choice(np.array([-1.0, 1.0]), shape)
                return (signs * rng.uniform(0.5, 1.0, shape)).astype(numpy_dtype(dtype))
            if np.dtype(dtype).kind == "b":
                return rng.integers(0, 2, shape).astype(dtype)
            if self.dtype != INT8:
                return np.zeros(shape, dtype)
            info = np.iinfo("int16" if dtype == ACCUMULATOR[INT8] else dtype)
            return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)

        return [draw(s, d) for s, d in zip(self.op.input_shapes(self.params), self.op.input_dtypes(self.params, self.dtype))]

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        """The expected output: in fp32 from floats (bf16 ones widened exactly); an int8 workload's exactly (in
        float64, which holds every i32 sum of u8 x i8 products exactly, rounded back)."""
        if self.dtype == INT8:
            exact = self.op.reference([a.astype("float64") for a in inputs], self.params)
            return np.rint(np.asarray(exact)).astype(self.output_dtype)
        as_fp32 = [a.astype("float32") if a.dtype.kind in "fV" else a for a in inputs]
        return np.asarray(self.op.reference(as_fp32, self.params)).astype(self.output_dtype)

    def tolerance(self) -> tuple[float, float]:
        """(rtol, atol) for the correctness check: int8 exact; bf16 operands accumulate in fp32, as the
        reference computes from the same values: fp32's."""
        return {"float32": (1e-3, 1e-3), BF16: (1e-3, 1e-3), INT8: (0.0, 0.0)}.get(self.dtype, (2e-2, 2e-2))

    def prim_func(self) -> Any:
        """The unscheduled PrimFunc every template starts from."""
        return self.op.prim_func(self.params, self.dtype)


def positive(p: Params, *keys: str) -> None:
    """Raise WorkloadError unless every key is a positive integer."""
    for k in keys:
        if not isinstance(p[k], int) or p[k] <= 0:
            raise WorkloadError(f"key '{k}' must be a positive integer, got {p[k]!r}")


def non_negative(p: Params, *keys: str) -> None:
    """Raise WorkloadError unless every key is a non-negative integer."""
    for k in keys:
        if not isinstance(p[k], int) or p[k] < 0:
            raise WorkloadError(f"key '{k}' must be a non-negative integer, got {p[k]!r}")


def conv_out(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
