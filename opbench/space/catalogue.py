"""The NNI search space of every preset under every template that applies to it: what ``search_spaces/``
holds (``opbench space --all``), for users who start from the files rather than the command."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opbench.exceptions import WorkloadError
from opbench.hardware.cpu_shape import CpuShape, shaped_for
from opbench.space import GENERIC_TEMPLATES, TEMPLATES, get_template
from opbench.space.amx import AMX_FLAG
from opbench.space.dot_product import INSTRUCTIONS
from opbench.workloads import PRESETS, parse_workload

Space = dict[str, dict[str, Any]]  # NNI search-space format


def preset_spaces() -> dict[str, Space]:
    """``<preset>.<template>`` -> the template's space for the preset (templates with knobs only), as on an AVX-512
    CPU with AMX and every dot-product instruction, whatever CPU writes them: the files are the same on every host."""
    isa = {"avx512f", AMX_FLAG, *(dot.isa for dots in INSTRUCTIONS.values() for dot in dots)}
    with shaped_for(CpuShape.of_isa(isa)):
        return _spaces()


def _spaces() -> dict[str, Space]:
    out: dict[str, Space] = {}
    for preset in sorted(PRESETS):
        workload = parse_workload(preset)
        for name in sorted(TEMPLATES):
            if name in GENERIC_TEMPLATES:
                continue
            try:
                template = get_template(workload, name, "cuda" if name.startswith("cuda_") else "llvm")
            except WorkloadError:
                continue  # not this op's
            space = template.search_space(workload)
            if space:
                out[f"{preset}.{name}"] = space
    return out


def render(space: Space) -> str:
    return json.dumps(space, indent=2, sort_keys=True) + "\n"


def write_spaces(folder: Path) -> list[Path]:
    """Write every :func:`preset_spaces` file into ``folder`` (made if missing), removing stale ones."""
    folder.mkdir(parents=True, exist_ok=True)
    spaces = preset_spaces()
    for stale in folder.glob("*.json"):
        if stale.stem not in spaces:
            stale.unlink()
    paths = []
    for key, space in spaces.items():
        path = folder / f"{key}.json"
        path.write_text(render(space))
        paths.append(path)
    return paths
