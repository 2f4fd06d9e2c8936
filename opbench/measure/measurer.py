"""A trial: (workload, config, resources, target) -> build -> check -> time -> record."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opbench.exceptions import ConfigError
from opbench.features import static_features
from opbench.measure.builder import LocalBuilder
from opbench.measure.corun import CoRunner, CoRunSpec, corun_records
from opbench.measure.lock import HostLock
from opbench.measure.runner import LocalRunner
from opbench.measure.types import BuildInput, BuildResult, LibraryInput, RunInput, RunResult, Status
from opbench.resources import Resources, host_facts
from opbench.space import Config, get_template
from opbench.tracking.schema import SCHEMA_VERSION, Record, latency_stats, new_trial_id
from opbench.workloads import PRESETS, Workload

DEFAULT_LOCK = Path(tempfile.gettempdir()) / "opbench-timing.lock"


@dataclass(frozen=True)
class TrialSpec:
    """What to measure: a workload under a config (knob values) with some resources."""

    workload: Workload
    config: Config = field(default_factory=dict, hash=False)
    resources: Resources = Resources()
    template: str | None = None  # None: the op's own template
    tags: dict[str, str] = field(default_factory=dict, hash=False)  # stamped on the record (engine ids)


@dataclass
class MeasureOptions:
    repeat: int = 5
    min_repeat_ms: float = 50.0
    build_timeout_s: float = 60.0
    run_timeout_s: float = 120.0
    build_workers: int = 1
    features: bool = True
    lock_path: Path = DEFAULT_LOCK


class Measurer:
    """Measures trials in persistent workers. Use as a context manager so workers are stopped."""

    def __init__(self, options: MeasureOptions | None = None) -> None:
        self.options = options or MeasureOptions()
        lock = HostLock(self.options.lock_path)
        self._builder = LocalBuilder(self.options.build_workers, self.options.build_timeout_s, lock)
        self._runner = LocalRunner(self.options.run_timeout_s, lock)
        self._corunner = CoRunner(self.options.run_timeout_s, lock)
        self._dir = tempfile.mkdtemp(prefix="opbench-build-")
        self.host = host_facts()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._builder.close()
        self._runner.close()
        self._corunner.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def warm_up(self, resources: Resources) -> None:
        self._runner.warm_up(resources)

    def measure(self, spec: TrialSpec) -> Record:
        return self.measure_batch([spec])[0]

    def measure_batch(self, specs: list[TrialSpec], on_record: Callable[[Record], None] | None = None) -> list[Record]:
        """Build all specs in parallel, then check and time them one at a time.

        Never raises for a bad trial: each outcome is a record with its status. ``on_record`` sees
        each record as soon as it exists, so a later crash loses nothing already measured.
        """
        started = time.perf_counter()
        built = list(zip(specs, self._build(specs)))
        records: dict[int, Record] = {}
        # Invalid configs first (they need no run), then each built trial as soon as it is timed.
        order = sorted(range(len(built)), key=lambda i: built[i][1][2].status is not Status.INVALID_CONFIG)
        for i in order:
            spec, (template, config, build) = built[i]
            run_started = time.perf_counter()
            if build.status is Status.INVALID_CONFIG:
                record = self._record(spec, template, config, started, build.status, build.error)
            else:
                run = self._run(build, spec) if build.status is Status.OK else None
                status = run.status if run else build.status
                error = (run.error if run else build.error) or ""
                # A trial's own time: its build (parallel builds overlap) plus its run and bookkeeping.
                record = self._record(spec, template, config, run_started - build.build_s, status, error, build, run)
            records[i] = record
            if on_record:
                on_record(record)
        return [records[i] for i in range(len(built))]

    def _build(self, specs: list[TrialSpec]) -> list[tuple[str, Config, BuildResult]]:
        """(template, validated config, build) per spec, built in parallel; invalid configs are not built."""
        out: list[tuple[str, Config, BuildResult]] = []
        to_build: list[tuple[int, BuildInput]] = []
        for spec in specs:
            template = get_template(spec.workload, spec.template)
            try:
                config = template.validate(spec.config, spec.workload)
            except ConfigError as exc:
                out.append((template.name, spec.config, BuildResult(Status.INVALID_CONFIG, str(exc))))
                continue
            to_build.append((len(out), BuildInput(spec.workload.spec, template.name, config, spec.resources.target,
                                                  spec.resources.threads, self._dir, self.options.features)))
            out.append((template.name, config, BuildResult(Status.BUILD_ERROR, "not built")))
        for (i, _), build in zip(to_build, self._builder.build([inp for _, inp in to_build])):
            out[i] = (out[i][0], out[i][1], build)
        return out

    def corun(self, spec: CoRunSpec) -> list[Record]:
        """Time the members of a co-run alone and then together; returns [co-run record, *member records].

        Every member is built and checked first; each is timed alone (solo, same harness and window)
        and then all start at one barrier and run for the same window (see :mod:`opbench.measure.corun`).
        """
        spec.validate()
        started = time.perf_counter()
        built = self._build(list(spec.members))
        try:
            failed = next(((m, b) for m, (_, _, b) in zip(spec.members, built) if b.status is not Status.OK), None)
            if failed is None:
                kernels = [(m, b.artifact or "") for m, (_, _, b) in zip(spec.members, built)]
                solo, together = self._corunner.measure(kernels, spec.mode, spec.window_s, spec.solo)
            else:
                solo, together = None, None
        finally:
            for _, _, build in built:
                if build.artifact and os.path.exists(build.artifact):
                    os.remove(build.artifact)
        members = [self._record(m, template, config, started, Status.OK, "", build)
                   for m, (template, config, build) in zip(spec.members, built)]
        return corun_records(spec, members, solo, together, failed)

    def measure_library(self, workload: Workload, library: str, resources: Resources) -> Record:
        """Time ``torch`` or ``numpy`` on the workload with the same threads; a record with template=library."""
        started = time.perf_counter()
        run = self._runner.run(LibraryInput(workload.spec, library, self.options.repeat, self.options.min_repeat_ms),
                               resources)
        return self._record(TrialSpec(workload, {}, resources), library, {}, started, run.status, run.error, run=run)

    def _run(self, build: BuildResult, spec: TrialSpec) -> RunResult:
        try:
            return self._runner.run(
                RunInput(build.artifact or "", spec.workload.spec, self.options.repeat, self.options.min_repeat_ms),
                spec.resources,
            )
        finally:
            if build.artifact and os.path.exists(build.artifact):
                os.remove(build.artifact)

    def _record(self, spec: TrialSpec, template: str, config: Config, started: float, status: Status, error: str,
                build: BuildResult | None = None, run: RunResult | None = None) -> Record:
        workload, res, host = spec.workload, spec.resources, self.host
        preset = PRESETS.get(workload.preset or "")
        record: Record = {
            "workload": workload.name, "op": workload.op.name, "shape": workload.shape, "dtype": workload.dtype,
            "template": template, "threads": res.threads, "cores": res.cores_label,
            "target": (build.target if build and build.target else res.target), "host": host.hostname,
            "tvm_version": host.tvm_version,
            "source_model": preset.model if preset else workload.op.source_model(workload.params),
            "status": status.value, "error": error[:4000], "schema_version": SCHEMA_VERSION,
            "trial_id": new_trial_id(),
        }
        record.update(spec.tags)
        record.update({f"knob.{k}": v for k, v in config.items()})
        if build is not None:
            record["build_s"] = build.build_s
        if run is not None:
            record["run_s"] = run.run_s
            if run.status is Status.OK:
                stats = latency_stats(run.latencies_s)
                gflops = workload.flops / (stats["latency_ms"] * 1e-3) / 1e9
                record.update(stats, gflops=gflops, peak_frac=gflops / host.peak_gflops(res.threads),
                              number=run.number, repeat=len(run.latencies_s),
                              latencies_ms=[t * 1e3 for t in run.latencies_s])
            if run.max_abs_err == run.max_abs_err:
                record["max_abs_err"] = run.max_abs_err
        record["trial_s"] = time.perf_counter() - started
        record["finished_at"] = time.time()  # unix seconds: tuning curves against wall time
        try:
            record.update(static_features(workload, config, template, res, host))
        except (KeyError, ValueError):  # an invalid config, or a library baseline with no knobs
            record.update(static_features(workload, {}, None, res, host))
        if build is not None:
            record.update(build.features)
        return record
