"""The tuning loop: an engine proposes, the measurer measures, the recorder stores, the engine hears."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

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


def run_tuning(engine: Engine, workload: Workload, count: int, measurer: Measurer, on_record: Callable[[TrialRecord], None],
               resources: Resources, template: str | None = None, batch: int = 1) -> list[TrialRecord]:
    """Ask the engine for configs in batches until ``count`` more trials are done (or it has no more).

    Each record is stored (``on_record``) before the engine hears it, so a kill in between leaves a
    record the engine can recover from on resume rather than a lost or repeated trial.
    """
    records: list[TrialRecord] = []
    remaining = count
    tmpl = get_template(workload, template, resources.target)
    while remaining > 0:
        proposals = valid_proposals(engine, workload, tmpl, min(batch, remaining))
        if not proposals:
            break
        specs = [_spec(workload, p, count - remaining + i, resources, template) for i, p in enumerate(proposals)]
        by_index: dict[str, Proposal] = {s.tags[ENGINE_TRIAL_TAG]: p for s, p in zip(specs, proposals)}

        def settle(record: TrialRecord, by_index: dict[str, Proposal] = by_index) -> None:
            fault_point("before-record")
            on_record(record)
            fault_point("before-tell")
            engine.tell(by_index[record[ENGINE_TRIAL_TAG]], record)
            records.append(record)

        measurer.measure_batch(specs, on_record=settle)
        remaining -= len(proposals)
    return records


def valid_proposals(engine: Engine, workload: Workload, template: Template, n: int,
                    max_rejects: int = REJECTS_PER_PROPOSAL) -> list[Proposal]:
    """Up to ``n`` proposals whose configs the template accepts for ``workload``.

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
                template.validate(split_resources(proposal, Resources())[0], workload)
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
