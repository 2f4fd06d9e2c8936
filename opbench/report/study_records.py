"""What a study's records hold, read one way by every reader (verification, reports, the CLI): its own ok
records, the schedule each ran, and its references (the latest ok one of each kind)."""
from __future__ import annotations

import functools

from opbench.record import TrialRecord, config_of, is_ok
from opbench.space import TEMPLATES
from opbench.workloads import parse_workload

TEMPLATE_DEFAULT = "template_default"

_workload = functools.cache(parse_workload)  # a study's records share a few workloads


def measured(records: list[TrialRecord]) -> list[TrialRecord]:
    """The study's own ok records (trials and references), not fresh-process ones."""
    return [r for r in records if is_ok(r) and r.get("record_kind", "trial") == "trial"]


def schedule_of(record: TrialRecord) -> dict:
    """What a trial's schedule is made of: its template's parameters for its config (knobs the config
    ignores left out), or its knob values where the template is not known."""
    template = TEMPLATES.get(str(record.get("template")))
    if template is None or "workload" not in record:
        return config_of(record)
    return template.parameters(config_of(record), _workload(record["workload"]))


def schedule_key(record: TrialRecord) -> tuple:
    return tuple(sorted(schedule_of(record).items()))


@functools.cache
def _default_key(workload: str, template: str, target: str) -> tuple:
    chosen = TEMPLATES[template]
    default = chosen.default_for(_workload(workload), "cuda" if "cuda" in target else "llvm")
    return tuple(sorted(chosen.parameters(default, _workload(workload)).items()))


def is_default(record: TrialRecord) -> bool:
    """Whether a trial ran its template's default schedule (the tuning loop's first trial of a fresh study)."""
    return record.template in TEMPLATES and schedule_key(record) == _default_key(record.workload, record.template,
                                                                                   record.target)


def default_trial(records: list[TrialRecord]) -> TrialRecord | None:
    """The study's earliest ok trial of its template's default schedule (the tuning loop's first), if any."""
    ok = sorted(measured(records), key=lambda r: r.get("finished_at", 0.0))
    return next((r for r in ok if not r.get("reference") and is_default(r)), None)


def references(records: list[TrialRecord]) -> dict[str, TrialRecord]:
    """The study's latest ok reference of each kind (te_default, torch, ...); its template default is the
    reference of that name where one was measured (a loop engine's study), else :func:`default_trial`."""
    ok = sorted(measured(records), key=lambda r: r.get("finished_at", 0.0))
    refs = {str(r["reference"]): r for r in ok if r.get("reference")}
    if TEMPLATE_DEFAULT not in refs and (default := default_trial(records)) is not None:
        refs[TEMPLATE_DEFAULT] = default
    return refs
