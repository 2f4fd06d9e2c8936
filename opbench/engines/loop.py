"""The tuning loop: an engine proposes, the measurer measures, the recorder stores, the engine hears."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from opbench.engines._base import Engine, Proposal
from opbench.exceptions import ConfigError
from opbench.hardware.resources import Resources, parse_cores
from opbench.lifecycle import fault_point
from opbench.measure.measurer import Measurer
from opbench.measure.types import TrialSpec
from opbench.record import TrialRecord
from opbench.space import Template, get_template
from opbench.workloads import Workload

ENGINE_TRIAL_TAG = "engine_trial"
REJECTS_PER_PROPOSAL = 50
CORES_KNOB = "cores"  # pseudo-knob of a space that searches core sets


Settle = Callable[[Proposal, TrialRecord, TrialRecord | None], None]  # (proposal, record stored, record told)


class Trials(Protocol):
    """What the loop measures a proposal as: one operator's trial (:class:`OperatorTrials`) or a co-run of
    several (:mod:`opbench.studies.collaborative`)."""

    def check(self, proposal: Proposal) -> None:
        """Raise :class:`ConfigError` for a proposal that is not a valid config (found without building)."""

    def measure(self, proposals: list[Proposal], first: int, settle: Settle) -> None:
        """Measure ``proposals`` (the ``first``-th of this session's onwards), settling each as its record comes."""


@dataclass
class OperatorTrials:
    """A proposal measured as one trial of ``workload`` under ``template`` (the op's default template when None)."""

    workload: Workload
    measurer: Measurer
    resources: Resources
    template: str | None = None

    def __post_init__(self) -> None:
        self.chosen = get_template(self.workload, self.template, self.resources.target)

    def check(self, proposal: Proposal) -> None:
        template_check(self.workload, self.chosen)(proposal)

    def measure(self, proposals: list[Proposal], first: int, settle: Settle) -> None:
        specs = [_spec(self.workload, p, first + i, self.resources, self.template) for i, p in enumerate(proposals)]
        by_index = {s.tags[ENGINE_TRIAL_TAG]: p for s, p in zip(specs, proposals)}
        self.measurer.measure_batch(specs, on_record=lambda record: settle(by_index[record[ENGINE_TRIAL_TAG]], record,
                                                                              None))


def run_tuning(engine: Engine, workload: Workload, count: int, measurer: Measurer, on_record: Callable[[TrialRecord], None],
               resources: Resources, template: str | None = None, batch: int = 1, fresh: bool = False) -> list[TrialRecord]:
    """:func:`tune` with :class:`OperatorTrials`; a ``fresh`` study's first trial is the template default
    (:meth:`Engine.enqueue`: the one way an engine is given it, one of the ``count``), so its best is never worse
    than the default it is compared with."""
    trials = OperatorTrials(workload, measurer, resources, template)
    if fresh:
        enqueue_default(engine, workload, trials.chosen, resources)
    return tune(engine, trials, count, on_record, batch)


def tune(engine: Engine, trials: Trials, count: int, on_record: Callable[[TrialRecord], None],
         batch: int = 1) -> list[TrialRecord]:
    """The one tuning loop: ask the engine for valid configs in batches until ``count`` more trials are done (or it
    has no more), measure them as ``trials`` does; returns the records stored, in the order they came.

    Each record is stored (``on_record``) before the engine hears it, so a kill in between leaves a
    record the engine can recover from on resume rather than a lost or repeated trial.
    """
    records: list[TrialRecord] = []
    remaining = count

    def settle(proposal: Proposal, record: TrialRecord, told: TrialRecord | None) -> None:
        fault_point("before-record")
        on_record(record)
        fault_point("before-tell")
        engine.tell(proposal, told or record)
        records.append(record)

    while remaining > 0:
        proposals = valid_proposals(engine, trials.check, min(batch, remaining))
        if not proposals:
            break
        trials.measure(proposals, count - remaining, settle)
        remaining -= len(proposals)
    return records


def enqueue_default(engine: Engine, workload: Workload, template: Template, resources: Resources) -> None:
    """Give a fresh study's engine the template default as its next proposal (what :func:`run_tuning` does for a
    ``fresh`` study; a study whose trials other processes take does it before they start)."""
    engine.enqueue(template.default_for(workload, resources.target), resources.threads)


def enqueue_other_algorithms(engine: Engine, workload: Workload, template: Template, resources: Resources) -> None:
    """Give a study that went on from the template default, next, that default with each other algorithm the
    template offers (:meth:`Template.other_algorithms`), each one of the study's trials."""
    for config in template.other_algorithms(workload, resources.target):
        engine.enqueue(config, resources.threads)


def template_check(workload: Workload, template: Template) -> Callable[[Proposal], None]:
    """The check that ``template`` takes a proposal's config for ``workload``."""
    def check(proposal: Proposal) -> None:
        template.validate(split_resources(proposal, Resources())[0], workload)
    return check


def valid_proposals(engine: Engine, check: Callable[[Proposal], None], n: int,
                    max_rejects: int = REJECTS_PER_PROPOSAL) -> list[Proposal]:
    """Up to ``n`` proposals that ``check`` accepts (it raises :class:`ConfigError` for the others).

    Invalid configs (a tile larger than its loop, ...) are found without building and handed back
    with :meth:`Engine.reject`, so they cost no trial, as MetaSchedule never measures an invalid
    schedule. After ``max_rejects`` rejections per wanted proposal one passes through and is recorded
    as ``invalid_config``, so an engine that only proposes invalid configs still ends.
    """
    out: list[Proposal] = []
    budget = max_rejects * n
    while len(out) < n:
        asked = engine.ask(n - len(out))
        if not asked:
            break
        for proposal in asked:
            try:
                check(proposal)
            except ConfigError as exc:
                if budget > 0:
                    budget -= 1
                    engine.rejected += 1
                    engine.reject(proposal, str(exc))
                    continue
            out.append(proposal)
    return out


def _spec(workload: Workload, proposal: Proposal, index: int, resources: Resources, template: str | None) -> TrialSpec:
    """``index`` counts this session's proposals; an engine's own trial number (Optuna's) is kept instead."""
    number = getattr(proposal.handle, "number", None)
    tag = str(number) if number is not None else f"b{index}"
    config, res = split_resources(proposal, resources)
    return TrialSpec(workload, config, res, template, tags={ENGINE_TRIAL_TAG: tag})


def split_resources(proposal: Proposal, resources: Resources) -> tuple[dict, Resources]:
    """The schedule config and the resources of a proposal: its threads, and its core set when the
    space searches ``cores`` (``--search-cores``), else the study's."""
    config = dict(proposal.config)
    cores = config.pop(CORES_KNOB, None)
    return config, dataclasses.replace(resources, threads=proposal.threads,
                                       cores=parse_cores(cores) if cores else resources.cores)
