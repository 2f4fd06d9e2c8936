"""A trial's record: what was measured (workload, template, config, resources, the host and the build) and
what its run measured (:func:`add_run`)."""
from __future__ import annotations

from opbench.hardware.resources import HostFacts, Resources
from opbench.hardware.targets import gpu_device_key, is_gpu
from opbench.measure.calibration import Bounds, widened
from opbench.measure.estimate import estimate, placement_values, split
from opbench.measure.features import FEATURES_VERSION, static_features
from opbench.measure.protocol import BuildResult, RunResult
from opbench.measure.series import latency_stats
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import TrialSpec
from opbench.record import FEATURE_PREFIX, MEM_PREFIX, Status, TrialRecord, knob_value
from opbench.space import LIBRARY_TEMPLATES, TEMPLATES, Config
from opbench.workloads import PRESETS


def ran_on(host: HostFacts, resources: Resources, run: RunResult | None) -> HostFacts:
    """Facts of the machine a trial ran on: ``host`` (this one), or the remote device (as far as it tells)."""
    if not resources.remote:
        return host
    if run is not None and run.device_facts:
        return HostFacts.from_dict(run.device_facts)
    return HostFacts.unknown(run.device_addr if run is not None and run.device_addr else resources.device)


def new_record(spec: TrialSpec, template: str, config: Config, status: Status, error: str, host: HostFacts,
               build: BuildResult | None = None, run: RunResult | None = None) -> TrialRecord:
    """The record of a trial of ``spec`` run on ``host`` (its run's numbers not yet added)."""
    workload, res = spec.workload, spec.resources
    preset = PRESETS.get(workload.preset or "")
    valid = status is not Status.INVALID_CONFIG and template not in LIBRARY_TEMPLATES
    features = static_features(workload, config if valid else {}, template if valid else None, res, host)
    features.update(build.features if build is not None else {})
    record = TrialRecord(
        workload=workload.name, task_key=workload.task_key, op=workload.op.name, shape=workload.shape,
        dtype=workload.dtype, template=template, template_version=TEMPLATES[template].version if template in TEMPLATES
        else "", threads=res.threads, cores=res.cores_label,
        target=build.target if build and build.target else res.target, host=host.hostname, cpu_model=host.cpu_model,
        device_key=gpu_device_key() if is_gpu(res.target) and not res.remote else host.device_key,
        tvm_version=host.tvm_version, features_version=FEATURES_VERSION if features else "", device=res.device,
        source_model=preset.model if preset else workload.op.source_model(workload.params),
        status=status.value, error=error[:4000], build_s=build.build_s if build is not None else None,
        knobs={k: knob_value(v) for k, v in config.items()},
        features={k[len(FEATURE_PREFIX):]: v for k, v in features.items()},
        memory={k[len(MEM_PREFIX):]: v for k, v in {**(build.memory if build is not None else {}),
                                                    **(run.memory if run is not None else {})}.items()})
    record.set(**spec.tags)
    return record


def add_run(record: TrialRecord, run: RunResult, timing: TimingPolicy, gflop: float, peak_gflops: float | None,
            calibrated: Bounds | None = None, computed_gflop: float | None = None) -> None:
    """Set on ``record`` what ``run`` (timed by ``timing``) measured: its estimate, interval (at least ``calibrated``'s
    span of re-measures around the estimate, where the device has one) and placements, its repeats and how they
    were taken, its throughput (the workload's ``gflop`` a second) and the share of ``peak_gflops`` (where there is
    one) that the GFLOPs the schedule computes (``computed_gflop``, by default ``gflop``) reach."""
    record.run_s, record.device_addr = run.run_s, run.device_addr or None
    if run.max_abs_err == run.max_abs_err:
        record.max_abs_err = run.max_abs_err
    if run.status is not Status.OK:
        return
    values = placement_values(run.latencies_s, run.placement_sizes)
    est = estimate(values, timing.agree)
    record.set(**latency_stats(split(run.latencies_s, run.placement_sizes)), **run.load)
    lo, hi = widened(est.lo_s, est.hi_s, est.latency_s, calibrated)
    record.latency_ms, record.latency_lo_ms, record.latency_hi_ms = est.latency_s * 1e3, lo * 1e3, hi * 1e3
    record.interval_calibration = calibrated.observed if calibrated is not None else 0
    record.placements, record.placements_agreeing = est.placements, est.agreeing
    record.placement_ms = [v * 1e3 for v in values]
    record.gflops = gflop / est.latency_s
    computed = gflop if computed_gflop is None else computed_gflop
    record.peak_frac = computed / est.latency_s / peak_gflops if peak_gflops else None
    record.number, record.repeat, record.latencies_ms = run.number, len(run.latencies_s), [t * 1e3 for t in run.latencies_s]
    record.energy_j, record.power_w = run.energy_j, run.power_w
    record.host_wait_s = run.host_wait_s
    record.cache_state, record.worker_pid = timing.cache_state, run.pid
    record.kernel_pid = run.kernel_pid or None
