"""Model sources: a name (or an ONNX file) -> a torch module with example inputs, or an ONNX model.

``torch``: plain modules written here (LSTM, GRU, a small CNN). ``transformers``: built from
configs with random weights (no hub access), each with a ``@tiny`` variant (few layers, small
hidden size) for tests. ``onnx``: any ``.onnx`` file, through Relax's ONNX frontend.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError

TINY = "@tiny"


@dataclass
class ModelSource:
    name: str
    kind: str  # "torch", "transformers" or "onnx"
    module: Any = None  # torch.nn.Module (torch, transformers)
    inputs: tuple[Any, ...] = ()  # example torch tensors
    onnx_path: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _lstm(tiny: bool, batch: int, seq: int, cell: str) -> tuple[Any, tuple[Any, ...]]:
    import torch

    hidden = 32 if tiny else 256

    class Recurrent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            rnn = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
            self.rnn = rnn(hidden, hidden, num_layers=1 if tiny else 2, batch_first=True)
            self.head = torch.nn.Linear(hidden, 10)

        def forward(self, x: Any) -> Any:
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    return Recurrent(), (torch.randn(batch, seq, hidden),)


def _small_cnn(tiny: bool, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    width, size = (8, 16) if tiny else (32, 64)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(width, 2 * width, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(2 * width, 10))
    return model, (torch.randn(batch, 3, size, size),)


TORCH_MODELS: dict[str, Callable[[bool, int, int], tuple[Any, tuple[Any, ...]]]] = {
    "lstm": lambda tiny, b, s: _lstm(tiny, b, s, "lstm"),
    "gru": lambda tiny, b, s: _lstm(tiny, b, s, "gru"),
    "small-cnn": _small_cnn,
}


def model_names() -> list[str]:
    """Every named model, each with its tiny variant."""
    from opbench.models.hf import HF_MODELS

    return [n + variant for n in (*TORCH_MODELS, *HF_MODELS) for variant in ("", TINY)]


def load_model(name: str, batch: int = 1, seq_len: int = 128) -> ModelSource:
    """The named model (``bert-base``, ``lstm@tiny``, ...) or an ONNX file, ready to import."""
    if name.endswith(".onnx"):
        path = Path(name)
        if not path.is_file():
            raise OpBenchError(f"ONNX file not found: {name}")
        return ModelSource(path.stem, "onnx", onnx_path=path)
    if batch < 1 or seq_len < 1:
        raise OpBenchError(f"--batch and --seq-len must be >= 1, got {batch} and {seq_len}")
    base, tiny = name.removesuffix(TINY), name.endswith(TINY)
    if base in TORCH_MODELS:
        module, inputs = TORCH_MODELS[base](tiny, batch, min(seq_len, 16) if tiny else seq_len)
        return ModelSource(name, "torch", module.eval(), inputs)
    from opbench.models.hf import HF_MODELS, build_hf

    if base in HF_MODELS:
        module, inputs = build_hf(base, tiny, batch, seq_len)
        return ModelSource(name, "transformers", module.eval(), inputs)
    raise OpBenchError(f"unknown model '{name}'; models: {', '.join(model_names())}, or a path to an .onnx file")
