"""Which config a study measures for a workload: its best from earlier studies, else the template default."""
from __future__ import annotations

from opbench.record import TrialRecord, best_ok, config_of, ok_records
from opbench.space import SPECIAL_TEMPLATES, Config, get_template
from opbench.workloads import Workload, parse_workload


def best_config(records: list[TrialRecord], workload: str) -> dict | None:
    """Knob values of the fastest ok tuning record of ``workload`` (references excluded)."""
    best = best_ok(r for r in ok_records(records, workload)
                   if not r.get("reference") and r.template not in SPECIAL_TEMPLATES)
    if best is None:
        return None
    return config_of(best)


def study_configs(names: tuple[str, ...], best_from: tuple[str, ...], tracking_uri: str | None
                  ) -> tuple[list[Workload], list[Config]]:
    """Workloads and their configs: each one's best in the ``best_from`` studies, else its template default."""
    from opbench.tracking import read_mlflow_records

    earlier = read_mlflow_records(list(best_from), tracking_uri) if best_from else []
    workloads = [parse_workload(n) for n in names]
    return workloads, [best_config(earlier, w.name) or get_template(w).default_config(w) for w in workloads]
