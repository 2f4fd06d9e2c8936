"""Schedule templates and their NNI-format search spaces (``search_spaces/<template>.json``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opbench.exceptions import SearchSpaceError, WorkloadError
from opbench.space._base import Config, Knob, Template
from opbench.space.fused import FusedTemplate
from opbench.space.gpu import GPU_TEMPLATES
from opbench.space.prescheduled import IRFileTemplate
from opbench.space.rowwise import NoScheduleTemplate, RowwiseTemplate
from opbench.space.tiled import TiledTemplate
from opbench.workloads import Workload

__all__ = ["Config", "Knob", "Template", "TEMPLATES", "get_template", "load_search_space", "SEARCH_SPACE_DIR"]

SEARCH_SPACE_DIR = Path(__file__).resolve().parents[2] / "search_spaces"

_WINDOW: dict[str, Any] = {"untiled_spatial": 1, "has_pad": True}  # n stays whole; a padding stage may exist
TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        TiledTemplate("matmul", tiled=("i", "j"), reduce_tiled=("k",)),
        TiledTemplate("batch_matmul", tiled=("i", "j"), reduce_tiled=("k",), untiled_spatial=1),
        TiledTemplate("dense", tiled=("i", "j"), reduce_tiled=("k",)),
        TiledTemplate("conv2d", tiled=("f", "y", "x"), reduce_tiled=("rc",), **_WINDOW),
        TiledTemplate("depthwise_conv2d", tiled=("c", "y", "x"), **_WINDOW),
        TiledTemplate("pool2d", tiled=("c", "y", "x"), **_WINDOW),
        RowwiseTemplate("softmax"),
        RowwiseTemplate("layer_norm"),
        RowwiseTemplate("add_relu", fuse_all=True),
        FusedTemplate(),
        NoScheduleTemplate(),
        IRFileTemplate(),
        *GPU_TEMPLATES,
    )
}
GENERIC_TEMPLATES = ("te_default", "metaschedule")


def get_template(workload: Workload, name: str | None = None, target: str = "llvm") -> Template:
    """The template for ``workload``: its op's own for ``target`` (``cuda_<op>`` on GPUs) unless
    ``name`` picks another that applies."""
    from opbench.hardware.targets import is_gpu

    if name is None and is_gpu(target):
        name = f"cuda_{workload.op.name}"
        if name not in TEMPLATES:
            gpu_ops = ", ".join(t.op for t in GPU_TEMPLATES)
            raise WorkloadError(f"no CUDA template for operator '{workload.op.name}' (CUDA templates: {gpu_ops})")
    name = name or workload.op.name
    if name not in TEMPLATES:
        raise WorkloadError(f"unknown template '{name}'; templates: {', '.join(TEMPLATES)}")
    if getattr(TEMPLATES[name], "op", name) != workload.op.name and name not in GENERIC_TEMPLATES:
        raise WorkloadError(f"template '{name}' does not apply to operator '{workload.op.name}'")
    return TEMPLATES[name]


def search_space_path(template: Template) -> Path:
    return SEARCH_SPACE_DIR / f"{template.name}.json"


def load_search_space(path: Path | str) -> dict[str, dict[str, Any]]:
    """Read and check an NNI-format search space (every knob a ``choice`` with a list of values)."""
    path = Path(path)
    try:
        space = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise SearchSpaceError(f"search space file not found: {path}") from exc
    except json.JSONDecodeError as exc:
        raise SearchSpaceError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(space, dict):
        raise SearchSpaceError(f"{path}: expected an object of knobs, got {type(space).__name__}")
    for knob, spec in space.items():
        if not isinstance(spec, dict) or "_type" not in spec or "_value" not in spec:
            raise SearchSpaceError(f"{path}: knob '{knob}' needs '_type' and '_value'")
        if spec["_type"] != "choice" or not isinstance(spec["_value"], list) or not spec["_value"]:
            raise SearchSpaceError(f"{path}: knob '{knob}' must be a choice over a non-empty list")
    return space
