"""User plugins: modules named in ``OPBENCH_PLUGINS`` (comma-separated) that register operators
and templates. Worker processes inherit the variable, so plugins work in builds and runs too."""
from __future__ import annotations

import functools
import importlib
import os

import opbench.workloads.models  # noqa: F401  (registers where model operators come from)
from opbench.exceptions import OpBenchError

PLUGIN_ENV = "OPBENCH_PLUGINS"


@functools.cache
def _load(names: str) -> None:
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise OpBenchError(f"cannot import plugin '{name}' named in {PLUGIN_ENV}: {exc}") from exc


def load_plugins() -> None:
    """Import the plugin modules once (per distinct value of the variable)."""
    _load(os.environ.get(PLUGIN_ENV, ""))


def register(operator, template, presets=None) -> None:
    """Add an operator (with its template and optional presets) to the catalogue."""
    from opbench.space import TEMPLATES
    from opbench.workloads import OPERATORS, PRESETS

    OPERATORS[operator.name] = operator
    TEMPLATES[template.name] = template
    PRESETS.update(presets or {})
