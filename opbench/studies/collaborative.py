"""Collaborative tuning: one trial chooses every co-running operator's config and the core layout
jointly and is scored on the co-run; the baseline tunes each operator alone (on all the cores, as a
user tuning it in isolation would), then co-runs the winners in every layout and keeps the best."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opbench import settings
from opbench.engines._base import Engine, Proposal, Space
from opbench.engines.loop import Settle, run_tuning, tune
from opbench.engines.optuna.storage import default_storage
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.record import TrialRecord, is_ok, tee
from opbench.space import Config, Template
from opbench.studies.configs import best_config
from opbench.studies.corun import Layout, corun_spec
from opbench.workloads import Workload

log = logging.getLogger("opbench")

OBJECTIVES = ("makespan", "throughput")
LAYOUT_KNOB = "layout"


def objective_value(corun: TrialRecord, objective: str) -> float:
    """What tuning minimises: the makespan (ms), or for throughput its inverse (ms per GFLOP)."""
    if objective not in OBJECTIVES:
        raise OpBenchError(f"unknown objective '{objective}'; objectives: {', '.join(OBJECTIVES)}")
    return corun["makespan_ms"] if objective == "makespan" else 1e3 / corun["gflops_total"]


def joint_space(spaces: list[Space], layouts: list[Layout]) -> Space:
    """Every member's knobs, prefixed ``<index>.``, plus the layout's label."""
    space = {f"{i}.{knob}": spec for i, member in enumerate(spaces) for knob, spec in member.items()}
    space[LAYOUT_KNOB] = {"_type": "choice", "_value": [layout.label for layout in layouts]}
    return space


def split_joint(point: dict, members: int) -> tuple[list[Config], str]:
    configs: list[Config] = [{} for _ in range(members)]
    for key, value in point.items():
        if key != LAYOUT_KNOB:
            index, knob = key.split(".", 1)
            configs[int(index)][knob] = value
    return configs, point[LAYOUT_KNOB]


@dataclass
class Best:
    """The best co-run an approach found: its co-run record, member configs and layout."""

    corun: TrialRecord
    configs: list[Config]
    layout: Layout


@dataclass
class CoTuning:
    """The co-run set-up shared by both approaches."""

    measurer: Measurer
    workloads: list[Workload]
    templates: list[Template]
    layouts: list[Layout]
    mode: str
    window_s: float
    objective: str
    on_record: Callable[[TrialRecord], None]

    def corun(self, configs: list[Config], layout: Layout, tags: dict[str, str], store_parent: bool = True) -> TrialRecord:
        """Co-run ``configs`` in ``layout``; stores the members' records (and the co-run's own, unless not
        ``store_parent``: the tuning loop stores it) and returns the co-run's own."""
        records = self.measurer.corun(corun_spec(self.workloads, configs, layout, self.mode, self.window_s, tags,
                                                 solo=False))
        for record in records:
            record.set(**tags)
        for record in records if store_parent else records[1:]:
            self.on_record(record)
        return records[0]

    def better(self, best: Best | None, corun: TrialRecord, configs: list[Config], layout: Layout) -> Best | None:
        if not is_ok(corun):
            return best
        if best is None or objective_value(corun, self.objective) < objective_value(best.corun, self.objective):
            return Best(corun, configs, layout)
        return best

    def jointly(self, engine: Engine, trials: int) -> tuple[Best | None, list[TrialRecord]]:
        """``trials`` co-run trials proposed by ``engine`` over :func:`joint_space`, through the one tuning loop."""
        joint = JointTrials(self)
        history = tune(engine, joint, trials, self.on_record)
        best: Best | None = None
        for corun in history:
            best = self.better(best, corun, *joint.chosen[corun.trial_id])
        return best, history

    def independently(self, engines: Sequence[Engine], trials: int, cores: tuple[int, ...]) -> tuple[Best | None, list]:
        """Tune each member alone for ``trials`` trials on all ``cores``, then co-run the winners in every layout."""
        resources = Resources(len(cores), cores)
        winners: list[Config] = []
        for engine, workload in zip(engines, self.workloads):
            records = run_tuning(engine, workload, trials, self.measurer,
                                 tee(lambda r: r.set(approach="independent"), self.on_record), resources, fresh=True)
            winner = best_config(records, workload.name)
            if winner is None:
                return None, winners
            winners.append(winner)
        best = None
        for layout in self.layouts:
            corun = self.corun(winners, layout, {"approach": "independent"})
            best = self.better(best, corun, winners, layout)
        return best, winners


class JointTrials:
    """A joint proposal measured as one co-run (:class:`~opbench.engines.loop.Trials`): its members' records stored
    first, the engine told the co-run's objective as its latency."""

    def __init__(self, tuning: CoTuning) -> None:
        self.tuning, self.layouts = tuning, {layout.label: layout for layout in tuning.layouts}
        self.chosen: dict[str, tuple[list[Config], Layout]] = {}  # co-run trial id -> its configs and layout

    def _configs(self, proposal: Proposal) -> tuple[list[Config], Layout]:
        t = self.tuning
        configs, label = split_joint(proposal.config, len(t.workloads))
        return [m.validate(c, w) for m, c, w in zip(t.templates, configs, t.workloads)], self.layouts[label]

    def check(self, proposal: Proposal) -> None:
        self._configs(proposal)

    def measure(self, proposals: list[Proposal], first: int, settle: Settle) -> None:
        for proposal in proposals:
            configs, layout = self._configs(proposal)
            corun = self.tuning.corun(configs, layout, {"approach": "collaborative"}, store_parent=False)
            self.chosen[corun.trial_id] = (configs, layout)
            objective = objective_value(corun, self.tuning.objective) if is_ok(corun) else None
            settle(proposal, corun, corun.replace(latency_ms=objective))


@dataclass
class Comparison:
    together: Best | None  # collaborative tuning's best co-run
    alone: Best | None  # the best co-run of the independently tuned winners (None when skipped)
    history: list[TrialRecord]  # the collaborative co-runs, in order

    def gain(self, objective: str) -> float:
        """Independent objective / collaborative objective (> 1: collaborative tuning helped)."""
        if self.together is None or self.alone is None:
            return math.nan
        return objective_value(self.alone.corun, objective) / objective_value(self.together.corun, objective)


def compare(tuning: CoTuning, trials: int, storage: str, study: str, sampler: str = "tpe", seed: int | None = 0,
            baseline: bool = True, cores: tuple[int, ...] = (0,)) -> Comparison:
    """Collaborative tuning (``trials`` co-runs) and, unless not ``baseline``, independent tuning
    (``trials`` solo trials per operator on ``cores``) plus co-runs of its winners. Optuna studies
    ``<study>-joint`` and ``<study>-alone-<i>`` in ``storage``."""
    from opbench.engines.optuna.engine import OptunaEngine

    spaces = [t.search_space(w) for t, w in zip(tuning.templates, tuning.workloads)]
    defaults = [t.default_config(w) for t, w in zip(tuning.templates, tuning.workloads)]
    initial = {f"{i}.{k}": v for i, d in enumerate(defaults) for k, v in d.items()}
    initial[LAYOUT_KNOB] = tuning.layouts[0].label
    joint = OptunaEngine(joint_space(spaces, tuning.layouts), len(cores), f"{study}-joint", storage, sampler, seed)
    joint.enqueue(initial, len(cores))
    log.info("--- collaborative: %d co-run trials (layouts %s)", trials, ", ".join(l.label for l in tuning.layouts))
    together, history = tuning.jointly(joint, trials)
    alone = None
    if baseline:
        log.info("--- independent: each operator tuned alone (%d trials, %d threads), then the winners co-run in "
                 "every layout", trials, len(cores))
        engines = [OptunaEngine(space, len(cores), f"{study}-alone-{i}", storage, sampler, seed)
                   for i, space in enumerate(spaces)]
        alone, _ = tuning.independently(engines, trials, cores)
    return Comparison(together, alone, history)


@dataclass(frozen=True)
class TogetherSpec:
    """Collaborative tuning of co-running ``workloads`` against tuning each alone (``baseline``)."""

    workloads: tuple[str, ...]
    trials: int = 32
    layouts: tuple[str, ...] = ()
    mode: str = "full"
    window_s: float = 0.3
    objective: str = "makespan"
    study: str | None = None  # default: from the workloads
    storage: str | None = None  # Optuna storage; default: a journal file next to the MLflow store
    sampler: str = "tpe"
    seed: int | None = 0
    baseline: bool = True
    tracking_uri: str | None = None
    run_timeout_s: float = settings.RUN_TIMEOUT_S

    def __post_init__(self) -> None:
        if len(self.workloads) < 2:
            raise OpBenchError("tune-together needs at least 2 workloads")


@dataclass
class TogetherResult:
    comparison: Comparison
    rows: list[tuple]  # approach, layout, makespan ms, GFLOP/s, objective
    metrics: dict[str, float]  # <approach>_objective and gain
    plot: Path


def tune_together(spec: TogetherSpec, on_record: Callable[[TrialRecord], None] | None = None) -> TogetherResult:
    """Run both approaches, log the comparison on the parent run and plot the collaborative curve."""
    import os

    from opbench.measure.types import MeasureOptions
    from opbench.report.plots import engine_curves
    from opbench.space import get_template
    from opbench.studies.corun import layouts_or_all
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir
    from opbench.workloads import parse_workload

    workloads = [parse_workload(w) for w in spec.workloads]
    layouts = [l for l in layouts_or_all(spec.layouts, len(workloads)) if spec.mode == "full" or l.shared]
    if not layouts:
        raise OpBenchError("a stream co-run needs a shared layout (every member on the same cores, e.g. '0,1')")
    study = spec.study or "together-" + "-".join(w.name for w in workloads)
    with Measurer(MeasureOptions(build_workers=2, run_timeout_s=spec.run_timeout_s)) as measurer, \
            Recorder(study, spec.tracking_uri, extra={"engine": "tune-together"}) as recorder:
        state = study_dir("optuna", study, recorder.uri)
        state.mkdir(parents=True, exist_ok=True)
        tuning = CoTuning(measurer, workloads, [get_template(w) for w in workloads], layouts, spec.mode, spec.window_s,
                          spec.objective, tee(recorder, *filter(None, [on_record])))
        result = compare(tuning, spec.trials, spec.storage or default_storage(state), study,
                         spec.sampler, spec.seed, spec.baseline, tuple(sorted(os.sched_getaffinity(0))))
        rows, metrics = [], {}
        for label, best in (("independent + co-run", result.alone), ("collaborative", result.together)):
            if best is not None:
                value = objective_value(best.corun, spec.objective)
                rows.append((label, best.layout.label, best.corun["makespan_ms"], best.corun["gflops_total"], value))
                metrics[f"{label.split()[0]}_objective"] = value
        metrics["gain"] = result.gain(spec.objective)
        recorder.log_parent({"objective": spec.objective, "mode": spec.mode}, metrics)
        curve = [TrialRecord(status=r.status, latency_ms=objective_value(r, spec.objective) if is_ok(r) else None)
                 for r in result.history]
        refs = {"independent + co-run": TrialRecord(latency_ms=metrics["independent_objective"])} \
            if result.alone is not None else {}
        plot = engine_curves({"collaborative": curve}, refs, f"{spec.objective}: collaborative vs independent",
                             study_dir("plots", study, recorder.uri) / "together.png")
        recorder.log_artifact(plot, "plots")
    return TogetherResult(result, rows, metrics, plot)
