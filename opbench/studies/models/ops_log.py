"""A profile's operators recorded as a study (``opbench model-ops``): one record per fused operator (its time,
share and memory with its schedule), the time-against-memory plot, and the whole model's numbers on the
parent run."""
from __future__ import annotations

from pathlib import Path

from opbench.hardware.resources import host_facts
from opbench.record import MEM_PREFIX, TrialRecord
from opbench.report.plots import tradeoff
from opbench.studies.models.profile import ModelProfile
from opbench.studies.models.tune import ModelSpec
from opbench.tracking import Recorder
from opbench.workloads import task_key_of
from opbench.workloads.fused import model_name
from opbench.workloads.models.extract import FusedOp


def op_record(spec: ModelSpec, op: FusedOp) -> TrialRecord:
    """A model operator's record as model-ops keeps it."""
    host, name = host_facts(), model_name(spec.model, op.name, spec.batch, spec.seq_len)
    return TrialRecord(workload=name, op=op.kind, task_key=task_key_of(name) or "", host=host.hostname,
                       cpu_model=host.cpu_model, tvm_version=host.tvm_version, template=op.schedule, dtype=op.dtype,
                       shape=";".join("x".join(map(str, s)) for s in op.shapes), source_model=spec.model,
                       threads=spec.threads, latency_ms=op.latency_ms, calls=op.calls, share=op.share,
                       key_op=str(op.key), flops=op.flops, gflops=op.flops / (op.latency_ms * 1e-3) / 1e9,
                       memory={k.removeprefix(MEM_PREFIX): v for k, v in op.memory.items()})


def record_ops(spec: ModelSpec, profile: ModelProfile, study: str, tracking_uri: str | None = None) -> Path:
    """Record ``profile``'s operators in ``study`` (one parent run); returns the time-against-memory plot
    (also an artifact of the run)."""
    ops = sorted(profile.ops, key=lambda o: -o.share)
    with Recorder(study, tracking_uri, extra={"engine": "model-ops"}, parent_tags={"model": spec.model}) as recorder:
        records = [op_record(spec, op) for op in ops]
        for record in records:
            recorder(record)
        plot = tradeoff(records, [], "memory", f"{spec.model}: each operator's time and workspace",
                        recorder.folder("plots") / "ops_time_memory.png")
        recorder.log_artifact(plot, "plots")
        recorder.log_parent({"model": spec.model, "batch": spec.batch, "seq_len": spec.seq_len,
                                    "threads": spec.threads},
                                   {"model_ms": profile.model_ms, "ops_sum_ms": profile.ops_ms,
                                    "torch_ms": profile.torch_ms, "max_abs_err": profile.max_abs_err,
                                    "fused_ops": len(ops), **{f"planned_{k.removeprefix(MEM_PREFIX)}_bytes": v
                                                               for k, v in profile.planned.items()}})
    return plot
