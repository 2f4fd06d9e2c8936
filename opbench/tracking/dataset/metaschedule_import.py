"""MetaSchedule's JSON database (TVM users' own tuning logs) as OpBench records.

Each tuning record becomes a trial: the workload's PrimFunc with the record's trace applied gives
the schedule, hence MetaSchedule's per-store features (``feat.ms*``) and the FLOPs; ``run_secs``
gives the latency (median). Records whose run failed (no or sentinel run times) get status
``run_error``. The op is ``tir`` (not a catalogue op), so op features other than FLOPs are NaN.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.measure.series import latency_stats
from opbench.record import Status, TrialRecord
from opbench.tracking.row import Row

FAILED_RUN_S = 1e9  # MetaSchedule stores 1e10 s for a failed run


def database_files(folder: Path) -> tuple[Path, Path]:
    workload, records = folder / "database_workload.json", folder / "database_tuning_record.json"
    missing = [p.name for p in (workload, records) if not p.is_file()]
    if missing:
        raise OpBenchError(f"{folder}: not a MetaSchedule JSON database (missing {', '.join(missing)})")
    return workload, records


def _trial_id(workload: str, trace: Any, target: Any) -> str:
    """The same id for the same tuning record however often it is imported: workload, trace and target hashed."""
    import json

    text = json.dumps([workload, str(trace.as_json()), str(target)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def import_metaschedule(folder: Path | str, study: str) -> list[Row]:
    """Every tuning record of the database in ``folder`` as a record (in the database's order), its trial
id derived from the record itself (:func:`_trial_id`)."""
    from opbench._tvm_compat import light_tensor_intrin

    light_tensor_intrin()
    import tvm_ffi
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from opbench.measure.features import schedule_features

    folder = Path(folder)
    workload_path, record_path = database_files(folder)
    try:
        database = ms.database.JSONDatabase(path_workload=str(workload_path), path_tuning_record=str(record_path))
        tuning_records = database.get_all_tuning_records()
    except Exception as exc:
        raise OpBenchError(f"{folder}: cannot read the MetaSchedule database: {exc}") from exc
    out = []
    for tuning in tuning_records:
        mod = tuning.workload.mod
        name = next(iter(mod.functions)).name_hint
        sch = s_tir.Schedule(mod)
        tuning.trace.apply_to_schedule(sch, remove_postproc=False)
        target = tuning.target
        threads = int(target.attrs.get("num-cores", 1)) if target is not None else 1
        flops = float(s_tir.analysis.estimate_tir_flops(mod))
        run_secs = [float(s) for s in (tuning.run_secs or [])]
        ok = bool(run_secs) and max(run_secs) < FAILED_RUN_S
        workload = f"tir:{name}-{tvm_ffi.structural_hash(mod) & 0xFFFFFFFF:08x}"
        record = TrialRecord(
            workload=workload, task_key=workload, op="tir", template="metaschedule", trial_id=_trial_id(workload, tuning.trace, target),
            threads=threads, cores="", target=str(target), host="imported", status=(Status.OK if ok else Status.RUN_ERROR).value,
            error="" if ok else "MetaSchedule recorded no successful run", study=study, engine="metaschedule-import",
            features={"flops": flops, "log_flops": math.log10(max(flops, 1.0)), "threads": float(threads)})
        if ok:
            stats = latency_stats([run_secs])
            record.set(**stats, gflops=flops / (stats["latency_ms"] * 1e-3) / 1e9,
                       latencies_ms=[s * 1e3 for s in run_secs], repeat=len(run_secs))
        row = record.to_row()
        row.update(schedule_features(sch.mod, target))
        out.append(row)
    return out

