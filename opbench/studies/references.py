"""What a study's speed-ups are measured against: TVM's unscheduled TE schedule, the template default, and
PyTorch and numpy where they implement the op, ONNX Runtime for an int8 one (timed in processes that never run
a TVM kernel; on a GPU target, PyTorch on the GPU and no numpy)."""
from __future__ import annotations

from collections.abc import Callable

from opbench import settings
from opbench.hardware.resources import Resources
from opbench.hardware.targets import is_gpu
from opbench.measure.measurer import Measurer
from opbench.measure.protocol import ONNXRUNTIME
from opbench.measure.types import TrialSpec
from opbench.measure.worker.onnx_int8 import ONNX_NODES
from opbench.record import TrialRecord
from opbench.workloads import BF16, INT8, Workload


def measure_references(measurer: Measurer, workload: Workload, resources: Resources,
                       on_record: Callable[[TrialRecord], None], template: str | None = None,
                       template_default: bool = True) -> dict[str, TrialRecord]:
    """TVM's TE default schedule, the default config of ``template`` (the op's default when None; not when
    ``template_default`` is False: a study whose tuning loop measures it first), PyTorch and numpy (where they
    implement the op), with the same threads; a baseline measured here
    within :func:`opbench.settings.baseline_reuse_s` is reused while the host reads its usual state."""
    refs = {} if is_gpu(resources.target) else {  # unscheduled TE has no thread binding: it cannot run on a GPU
        "te_default": measurer.measure(TrialSpec(workload, {}, resources, "te_default"))}
    if template_default:
        refs["template_default"] = measurer.measure(TrialSpec(workload, {}, resources, template))
    for library in library_references(workload, resources):
        refs[library] = measurer.measure_library(workload, library, resources, settings.baseline_reuse_s())
    for name, record in refs.items():
        record.set(reference=name)
        on_record(record)
    return refs


def library_references(workload: Workload, resources: Resources) -> list[str]:
    """The libraries a study of ``workload`` is measured against: PyTorch and numpy where they implement the
    op, on this host only (numpy never on a GPU target, nor in bf16); for int8 (u8 x i8 into i32, which neither
    computes) ONNX Runtime's integer operators."""
    if resources.remote:
        return []
    if workload.dtype == INT8:
        return [ONNXRUNTIME] if workload.op.name in ONNX_NODES and not is_gpu(resources.target) else []
    numpy = workload.op.numpy_impl and workload.dtype != BF16 and not is_gpu(resources.target)  # numpy has no bf16
    return [library for library, implements in (("torch", workload.op.torch_baseline), ("numpy", numpy)) if implements]
