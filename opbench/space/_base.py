"""Knobs, configs and the :class:`Template` base class shared by every schedule template.

A template's space is derived from the workload (:meth:`Template.knobs`): every point of it is a
schedule that applies, as AutoTVM's ``define_split`` offers only factorizations of a loop's extent
and MetaSchedule's ``sample_perfect_tile`` samples only perfect tiles. A tuner, NNI's included,
samples it by its own rules and never meets an invalid point.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbench.exceptions import ConfigError, WorkloadError
from opbench.hardware.cpu_shape import shaped_for
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm import IRModule
    from tvm.s_tir import Schedule

Config = dict[str, Any]
SPLIT_SEP = "x"


def divisors(extent: int, cap: int | None = None) -> tuple[int, ...]:
    """The divisors of ``extent`` not above ``cap``, ascending."""
    return tuple(d for d in range(1, min(extent, cap or extent) + 1) if extent % d == 0)


def split_choices(extent: int, caps: tuple[int, ...]) -> tuple[str, ...]:
    """Perfect factorizations ``outer x f1 x f2 ...`` of ``extent``, inner factor ``f_i`` at most
    ``caps[i]``, as knob values such as ``"16x8x4"`` (outer 16, middle 8, inner 4 for 512)."""
    def inner(rest: int, level: int) -> list[tuple[int, ...]]:
        if level == len(caps):
            return [()]
        return [(f, *more) for f in divisors(rest, caps[level]) for more in inner(rest // f, level + 1)]

    factors = sorted(inner(extent, 0), key=lambda fs: fs[::-1])
    return tuple(SPLIT_SEP.join(map(str, (extent // _prod(fs), *fs))) for fs in factors)


def split_factors(value: str) -> tuple[int, ...]:
    """The factors of a split knob's value, outermost first (``"16x8x4"`` -> ``(16, 8, 4)``)."""
    return tuple(int(f) for f in value.split(SPLIT_SEP))


def _same_kind(value: Any, choice: Any) -> bool:
    """Whether ``value`` may stand for ``choice``: both strings, both booleans, or both plain numbers."""
    if isinstance(choice, bool) or isinstance(value, bool):
        return isinstance(choice, bool) and isinstance(value, bool)
    if isinstance(choice, numbers.Number):
        return isinstance(value, numbers.Number)
    return type(value) is type(choice)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _prod(values: tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


@dataclass(frozen=True)
class Knob:
    """One decision of a workload's space: a name, the values it may take, and what it controls."""

    name: str
    choices: tuple[Any, ...]
    help: str

    def choice(self, value: Any, where: str) -> Any:
        """The choice ``value`` stands for, or ConfigError naming the knob: a value of another type never
        passes for one (``True`` is not ``1``, ``1.0`` is not ``"1"``); an integral number that equals an
        integer choice does (JSON and numpy hand those over as floats or numpy ints)."""
        for choice in self.choices:
            if _same_kind(value, choice) and value == choice:
                return choice
        shown = list(self.choices) if len(self.choices) <= 12 else [*self.choices[:10], "...", self.choices[-1]]
        raise ConfigError(self.name, f"value {_short(value)} ({type(value).__name__}) is not one of {shown} on {where}")

    def to_nni(self) -> dict[str, Any]:
        return {"_type": "choice", "_value": list(self.choices)}


@dataclass(frozen=True)
class Nest:
    """The compute loop nest a config makes, in elements, named alike for every template so that a latency
    model compares configs of different operators (docs/workloads-and-templates.md#nest).

    ``tile``: the register tile (accumulators) per loop, the vectorised loop last; ``vector``: the
    vectorised loop's extent as built (0: not vectorised); ``reduce``: reduction steps of the innermost
    reduction chunk; ``parallel``: iterations of the parallel loop (1: none).
    """

    tile: tuple[int, ...]
    vector: int
    reduce: int
    parallel: int

    @property
    def rows(self) -> int:
        """The register tile's rows: every loop of it but the vectorised one."""
        return math.prod(self.tile[:-1])

    @property
    def columns(self) -> int:
        """The register tile's extent along the vectorised loop."""
        return self.tile[-1]


class Template(ABC):
    """Applies a config (a dict of knob values) to a ``tvm.s_tir.Schedule`` of one op kind.

    Knob values are what a tuner samples; :meth:`parameters` is what the schedule is made of (tile
    sizes as numbers, choices as names), the same columns for every workload so that features
    compare configs across workloads.
    """

    name: str

    @property
    def version(self) -> str:
        """A hash of the source the template's schedules come from (its class and the OpBench classes it
        builds on): records of two versions may hold different schedules for one config."""
        return _source_hash(type(self))

    @abstractmethod
    def knobs(self, workload: Workload) -> list[Knob]:
        """The space for ``workload``: every combination of these values applies."""

    def refusal(self, workload: Workload) -> str | None:
        """Why the template does not schedule ``workload`` of its operator (None: it does)."""
        return None

    def check_applies(self, workload: Workload) -> None:
        """WorkloadError naming :meth:`refusal`'s reason where the template does not schedule ``workload``."""
        refusal = self.refusal(workload)
        if refusal:
            raise WorkloadError(f"template '{self.name}' does not apply to {workload.name}: {refusal}")

    @abstractmethod
    def default_config(self, workload: Workload) -> Config:
        """The template's own default schedule for ``workload``: a point of its space."""

    def default_for(self, workload: Workload, target: str) -> Config:
        """:meth:`default_config` for kernels that run on ``target``'s CPU (its vectors and caches)."""
        with shaped_for(target):
            return self.default_config(workload)

    def other_algorithms(self, workload: Workload, target: str) -> list[Config]:
        """:meth:`default_for` with each algorithm the space offers besides the default's (none here): a trial of
        each tells whether one the default's rule passed over pays on this CPU."""
        return []

    def nest(self, config: Config, workload: Workload) -> Nest | None:
        """The compute nest a validated ``config`` makes on ``workload`` (None: the template does not say)."""
        return None

    @abstractmethod
    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        """Schedule ``sch`` (a fresh schedule of ``workload``'s PrimFunc) with a validated config."""

    def arithmetic_flops(self, config: Config, workload: Workload) -> float:
        """FLOPs the schedule of a validated ``config`` computes (what ``peak_frac`` counts): the workload's own
        FLOPs, unless the config takes an algorithm that computes a different amount (Winograd)."""
        return workload.flops

    def parameters(self, config: Config, workload: Workload) -> Config:
        """The schedule parameters a complete config stands for (by default its knob values)."""
        return dict(config)

    def parameter_vocabulary(self) -> dict[str, tuple[Any, ...] | None]:
        """Every schedule parameter's name: its fixed vocabulary when categorical, else None."""
        return {}

    def check(self, config: Config, workload: Workload) -> None:
        """Checks of a complete config beyond its knobs' choices: a plugin template's, and the CUDA templates'
        shared-memory budget (a limit across knobs); the CPU templates' spaces hold only schedules that apply."""

    def schedule(self, workload: Workload, config: Config) -> IRModule:
        """The scheduled IRModule of ``workload`` under a validated ``config`` (in a worker: imports TVM)."""
        import tvm
        from tvm import s_tir

        sch = s_tir.Schedule(tvm.IRModule({"main": workload.prim_func()}))
        self.apply(sch, config, workload)
        return sch.mod

    def search_space(self, workload: Workload) -> dict[str, dict[str, Any]]:
        """The space for ``workload`` in NNI's search-space format."""
        return {k.name: k.to_nni() for k in self.knobs(workload)}

    def validate(self, config: Config, workload: Workload) -> Config:
        """Return the complete config (missing knobs take the default) or raise ConfigError."""
        knobs = {k.name: k for k in self.knobs(workload)}
        given = {}
        for name, value in config.items():
            if not isinstance(name, str) or name not in knobs:
                known = ", ".join(knobs) or "none"
                raise ConfigError(str(name), f"unknown knob for template '{self.name}' on {workload.name} (knobs: {known})")
            given[name] = knobs[name].choice(value, workload.name)
        full = {**self.default_config(workload), **given}
        self.check(full, workload)
        return full


@functools.cache
def _source_hash(cls: type) -> str:
    """The sources a template's schedules come from (:func:`source_files`), hashed."""
    return hashlib.sha256(b"".join(Path(f).read_bytes() for f in source_files(cls))).hexdigest()[:12]


def source_files(cls: type) -> list[str]:
    """The files of the template's classes' modules and of every ``opbench.space`` module they reach through
    what they import, functions and classes or whole modules (``from opbench.space import winograd``)."""
    import sys
    import types

    todo = [c.__module__ for c in cls.__mro__]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not name.startswith("opbench.space") or name not in sys.modules:
            continue
        seen.add(name)
        todo += [obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", "") or ""
                 for obj in vars(sys.modules[name]).values()]
    return sorted(f for f in (inspect.getsourcefile(sys.modules[m]) for m in seen) if f)
