"""What a study's speed-ups are measured against: TVM's unscheduled TE schedule, the template default, and
PyTorch and numpy where they implement the op (timed in processes that never run a TVM kernel; on a GPU
target, PyTorch on the GPU and no numpy)."""
from __future__ import annotations

from collections.abc import Callable

from opbench import settings
from opbench.hardware.resources import Resources
from opbench.hardware.targets import is_gpu
from opbench.measure.measurer import LIBRARY_PROCESSES, Measurer
from opbench.measure.types import TrialSpec
from opbench.record import Record
from opbench.workloads import Workload


def measure_references(measurer: Measurer, workload: Workload, resources: Resources,
                       on_record: Callable[[Record], None], template: str | None = None,
                       verified: bool = False) -> dict[str, Record]:
    """TVM's TE default schedule, the default config of ``template`` (the op's default when None),
    PyTorch and numpy (where they implement the op), with the same threads; a baseline measured here
    within :func:`opbench.settings.baseline_reuse_s` is reused while the host reads its usual state.
    A baseline takes one fresh process, not three, when the study will be ``verified`` (its speed-ups
    are then quoted from the verification's fresh processes, never from these)."""
    refs = {} if is_gpu(resources.target) else {  # unscheduled TE has no thread binding: it cannot run on a GPU
        "te_default": measurer.measure(TrialSpec(workload, {}, resources, "te_default"))}
    refs["template_default"] = measurer.measure(TrialSpec(workload, {}, resources, template))
    local = not resources.remote  # library baselines run on this host only
    reuse_s, processes = settings.baseline_reuse_s(), 1 if verified else LIBRARY_PROCESSES
    if workload.op.torch_baseline and local:
        refs["torch"] = measurer.measure_library(workload, "torch", resources, processes, reuse_s)
    if workload.op.numpy_impl and local and not is_gpu(resources.target):
        refs["numpy"] = measurer.measure_library(workload, "numpy", resources, processes, reuse_s)
    for name, record in refs.items():
        record["reference"] = name
        on_record(record)
    return refs
