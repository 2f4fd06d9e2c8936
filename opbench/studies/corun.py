"""Co-run layouts (who gets which cores) and the interference study: slowdown matrices of workload
pairs across layouts."""
from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from opbench import settings
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores
from opbench.measure.corun import CoRunSpec
from opbench.measure.measurer import Measurer
from opbench.measure.types import TrialSpec
from opbench.record import TrialRecord, is_ok, tee
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


def layouts_or_all(texts: tuple[str, ...], members: int) -> list[Layout]:
    """Parsed layouts, or (none given) every split of this process's cores among ``members`` plus all sharing."""
    if texts:
        return [parse_layout(t, members) for t in texts]
    return layouts_for(members, tuple(sorted(os.sched_getaffinity(0))))


def corun_spec(workloads: list[Workload], configs: list[Config], layout: Layout, mode: str,
               window_s: float, tags: dict[str, str] | None = None, solo: bool = True) -> CoRunSpec:
    if mode == "stream" and not layout.shared:
        raise OpBenchError(f"a stream co-run runs on one core set; layout '{layout.label}' splits the cores")
    members = tuple(TrialSpec(w, c, r, tags=dict(tags or {}, layout=layout.label))
                    for w, c, r in zip(workloads, configs, layout.resources()))
    return CoRunSpec(members, mode, window_s, solo)


def interference(measurer: Measurer, workloads: list[Workload], configs: list[Config], layouts: list[Layout],
                 modes: list[str], window_s: float, on_record: Callable[[TrialRecord], None]) -> dict[str, pd.DataFrame]:
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


@dataclass(frozen=True)
class InterferenceSpec:
    """Pairs of ``workloads`` co-running in ``layouts`` (default: every split) and ``modes``."""

    workloads: tuple[str, ...]
    layouts: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("full",)
    window_s: float = 0.5
    study: str = "corun-study"
    tracking_uri: str | None = None
    best_from: tuple[str, ...] = ()
    run_timeout_s: float = settings.RUN_TIMEOUT_S

    def __post_init__(self) -> None:
        from opbench.measure.corun import MODES

        if len(self.workloads) < 2:
            raise OpBenchError("study corun needs at least 2 workloads")
        if bad := [m for m in self.modes if m not in MODES]:
            raise OpBenchError(f"unknown co-run mode(s) {bad}; modes: {', '.join(MODES)}")


@dataclass
class InterferenceResult:
    matrices: dict[str, pd.DataFrame]  # per "mode layout": row slowed down by column
    plot: Path


def run_interference_study(spec: InterferenceSpec, on_record: Callable[[TrialRecord], None] | None = None) -> InterferenceResult:
    """The slowdown matrices, recorded to MLflow with a heatmap (a file and an artifact)."""
    from opbench.measure.types import MeasureOptions
    from opbench.report.plots import slowdown_heatmaps
    from opbench.studies.configs import study_configs
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir

    workloads, configs = study_configs(spec.workloads, spec.best_from, spec.tracking_uri)
    layouts = layouts_or_all(spec.layouts, 2)
    with Measurer(MeasureOptions(run_timeout_s=spec.run_timeout_s)) as measurer, \
            Recorder(spec.study, spec.tracking_uri, extra={"engine": "corun-study"}) as recorder:
        matrices = interference(measurer, workloads, configs, layouts, list(spec.modes), spec.window_s,
                                tee(recorder, *filter(None, [on_record])))
        plot = slowdown_heatmaps(matrices, "co-run slowdown (x solo latency)",
                                 study_dir("plots", spec.study, recorder.uri) / "slowdown.png")
        recorder.log_artifact(plot, "plots")
    return InterferenceResult(matrices, plot)
