"""Knobs, configs and the :class:`Template` base class shared by every schedule template."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbench.exceptions import ConfigError
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm import IRModule
    from tvm.s_tir import Schedule

Config = dict[str, Any]


def axis_extents(workload: Workload) -> dict[str, int]:
    """Each anchor loop's extent by name: what tile knobs are checked against."""
    return {a.name: a.extent for a in workload.axes}


@dataclass(frozen=True)
class Knob:
    """One schedule decision: a name, the values it may take, and what it controls."""

    name: str
    choices: tuple[Any, ...]
    help: str

    def to_nni(self) -> dict[str, Any]:
        return {"_type": "choice", "_value": list(self.choices)}


class Template(ABC):
    """Applies a config (a dict of knob values) to a ``tvm.s_tir.Schedule`` of one op kind.

    The space (``knobs``) is the same for every workload of the template, so it can live in one
    ``search_spaces/<name>.json``; which values fit a given shape is checked by :meth:`validate`.
    """

    name: str

    @abstractmethod
    def knobs(self) -> list[Knob]: ...

    @abstractmethod
    def default_config(self, workload: Workload) -> Config:
        """A valid, reasonable config for ``workload`` (the template's own default schedule)."""

    @abstractmethod
    def check(self, config: Config, workload: Workload) -> None:
        """Shape-dependent checks of a complete config; raise ConfigError naming the knob."""

    @abstractmethod
    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        """Schedule ``sch`` (a fresh schedule of ``workload``'s PrimFunc) with a validated config."""

    def schedule(self, workload: Workload, config: Config) -> IRModule:
        """The scheduled IRModule of ``workload`` under a validated ``config`` (in a worker: imports TVM)."""
        import tvm
        from tvm import s_tir

        sch = s_tir.Schedule(tvm.IRModule({"main": workload.prim_func()}))
        self.apply(sch, config, workload)
        return sch.mod

    def search_space(self) -> dict[str, dict[str, Any]]:
        """This template's space in NNI's search-space format."""
        return {k.name: k.to_nni() for k in self.knobs()}

    def validate(self, config: Config, workload: Workload) -> Config:
        """Return the complete config (missing knobs take the default) or raise ConfigError."""
        knobs = {k.name: k for k in self.knobs()}
        for name, value in config.items():
            if name not in knobs:
                known = ", ".join(knobs) or "none"
                raise ConfigError(name, f"unknown knob for template '{self.name}' (knobs: {known})")
            if value not in knobs[name].choices:
                raise ConfigError(name, f"value {value!r} is not one of {list(knobs[name].choices)}")
        full = {**self.default_config(workload), **config}
        self.check(full, workload)
        return full
