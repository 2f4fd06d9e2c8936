"""Co-run layouts (who gets which cores) and the interference study: slowdown matrices of workload
pairs across layouts."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores
from opbench.measure.corun import CoRunSpec
from opbench.measure.measurer import Measurer
from opbench.measure.types import TrialSpec
from opbench.record import Record, is_ok
from opbench.space import Config
from opbench.workloads import Workload


@dataclass(frozen=True)
class Layout:
    """One core set per co-run member; each member runs as many threads as its set has cores."""

    cores: tuple[tuple[int, ...], ...]

    @property
    def label(self) -> str:
        return "|".join(",".join(map(str, c)) for c in self.cores)

    @property
    def shared(self) -> bool:
        """Every member on the same cores (the only layout a stream co-run takes)."""
        return len(set(self.cores)) == 1

    def resources(self) -> list[Resources]:
        return [Resources(len(c), c) for c in self.cores]


def parse_layout(text: str, members: int) -> Layout:
    """``"0|1"``: member 1 on core 0, member 2 on core 1; ``"0,1"`` alone: every member on cores 0,1."""
    parts = text.split("|")
    if len(parts) == 1:
        parts *= members
    if len(parts) != members:
        raise OpBenchError(f"layout '{text}' gives {len(parts)} core sets for {members} workloads")
    cores = []
    for part in parts:
        cores_of = parse_cores(part)
        if not cores_of:
            raise OpBenchError(f"layout '{text}': empty core set")
        cores.append(cores_of)
    return Layout(tuple(cores))


def layouts_for(members: int, cores: tuple[int, ...]) -> list[Layout]:
    """Every contiguous split of ``cores`` among the members (each gets at least one), then all sharing."""
    out = []
    for cuts in itertools.combinations(range(1, len(cores)), members - 1):
        bounds = (0, *cuts, len(cores))
        out.append(Layout(tuple(cores[a:b] for a, b in zip(bounds, bounds[1:]))))
    return out + [Layout((cores,) * members)]


def corun_spec(workloads: list[Workload], configs: list[Config], layout: Layout, mode: str,
               window_s: float, tags: dict[str, str] | None = None, solo: bool = True) -> CoRunSpec:
    if mode == "stream" and not layout.shared:
        raise OpBenchError(f"a stream co-run runs on one core set; layout '{layout.label}' splits the cores")
    members = tuple(TrialSpec(w, c, r, tags=dict(tags or {}, layout=layout.label))
                    for w, c, r in zip(workloads, configs, layout.resources()))
    return CoRunSpec(members, mode, window_s, solo)


def interference(measurer: Measurer, workloads: list[Workload], configs: list[Config], layouts: list[Layout],
                 modes: list[str], window_s: float, on_record: Callable[[Record], None]) -> dict[str, pd.DataFrame]:
    """Co-run every pair (a workload with itself included) in every layout and mode. Returns, per
    ``"mode layout"``, the slowdown matrix: row = the workload slowed down, column = its partner."""
    names = [w.name for w in workloads]
    out: dict[str, pd.DataFrame] = {}
    for mode, layout in itertools.product(modes, layouts):
        if mode == "stream" and not layout.shared:
            continue
        matrix = pd.DataFrame(math.nan, index=names, columns=names)
        for i, j in itertools.combinations_with_replacement(range(len(workloads)), 2):
            spec = corun_spec([workloads[i], workloads[j]], [configs[i], configs[j]], layout, mode, window_s)
            parent, first, second = measurer.corun(spec)
            for record in (parent, first, second):
                on_record(record)
            if is_ok(parent):  # a workload next to itself: the two copies' mean
                matrix.iloc[i, j] = first["slowdown"] if i != j else (first["slowdown"] + second["slowdown"]) / 2
                matrix.iloc[j, i] = second["slowdown"] if i != j else matrix.iloc[i, j]
        out[f"{mode} {layout.label}"] = matrix
    if not out:
        raise OpBenchError("no layout fits the modes: stream co-runs need a shared layout such as '0,1'")
    return out
