"""A trial: (workload, config, resources, target) -> build -> check -> time -> record."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import shutil
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from opbench import settings
from opbench.exceptions import ConfigError, ResourceError
from opbench.hardware.cpu_shape import shaped_for
from opbench.hardware.devices import parse_device
from opbench.hardware.host_speed import HostSpeed, default_history
from opbench.hardware.lock import HostLock
from opbench.hardware.peak import PeakCache
from opbench.hardware.resources import LOCAL, Resources, host_facts
from opbench.hardware.targets import is_gpu
from opbench.measure.baselines import BaselineCache, baseline_key
from opbench.measure.builder import Built, KeptBuilds, LocalBuilder, build_key, discard
from opbench.measure.calibration import Calibration
from opbench.measure.corun import CoRunSpec, corun_records
from opbench.measure.estimate import estimated_ms
from opbench.measure.protocol import (
    BuildInput,
    BuildResult,
    LibraryInput,
    ModelInput,
    ModelProfileInput,
    PeakInput,
    PrimFuncInput,
    RunInput,
    RunResult,
)
from opbench.measure.rpc import check_device
from opbench.measure.runner import LocalRunner, RPCRunner, Runner
from opbench.measure.runner.corun import CoRunInput, CoRunner
from opbench.measure.timing import TimingPolicy
from opbench.measure.trial_record import add_run, new_record, ran_on
from opbench.measure.types import MeasureOptions, TrialSpec
from opbench.paths import build_dir
from opbench.record import Status, TrialRecord
from opbench.space import LIBRARY_TEMPLATES, Config, computed_flops, get_template, peak_units
from opbench.workloads import Workload

log = logging.getLogger(__name__)


class Measurer:
    """Measures trials in persistent workers. Use as a context manager so workers are stopped."""

    def __init__(self, options: MeasureOptions | None = None) -> None:
        settings.check_environment()
        self.options = options or MeasureOptions()
        lock = HostLock(self.options.lock_path)
        self._builder = LocalBuilder(self.options.build_workers, self.options.build_timeout_s, lock)
        self._lock = lock
        self._local = LocalRunner(self.options.run_timeout_s, lock, HostSpeed(default_history()))
        self._corunner = CoRunner(self.options.run_timeout_s, lock)
        self._runners: dict[str, Runner[RunInput, RunResult]] = {LOCAL: self._local}  # device spec -> its runner
        self._dir = str(build_dir())
        self._baselines = BaselineCache()
        self._peaks = PeakCache()
        self.calibration = Calibration()  # fresh-process re-measures by device: what a record's interval spans
        self._kept: KeptBuilds | None = None  # while reusing_builds
        self.host = host_facts()

    @property
    def timing(self) -> TimingPolicy:
        return self.options.timing

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._builder.close()
        self._corunner.close()
        for runner in self._runners.values():
            runner.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def warm_up(self, resources: Resources, libraries: tuple[str, ...] = (), models: tuple[str, ...] = ()) -> None:
        """Start the worker (or get the remote sessions) for ``resources`` now, not in a trial; on this host,
        with it, what fresh processes timing ``libraries`` and ``models`` in PyTorch eager fork from."""
        if resources.remote:
            check_device(parse_device(resources.device))
            self._runner(resources.device).warm_up(resources)
        else:
            self._local.warm_up(resources, libraries, models)

    def measure(self, spec: TrialSpec) -> TrialRecord:
        return self.measure_batch([spec])[0]

    def measure_batch(self, specs: list[TrialSpec], on_record: Callable[[TrialRecord], None] | None = None) -> list[TrialRecord]:
        """Validate all specs, build the valid ones in parallel, then check and time them.

        Local runs take turns; remote ones run at once on as many devices as the runner holds. Never
        raises for a bad trial: each outcome is a record with its status. ``on_record`` sees each record
        as soon as it exists (invalid configs first), so a later crash loses nothing already measured.
        """
        started = time.perf_counter()
        checked = [self._validate(spec) for spec in specs]
        records: dict[int, TrialRecord] = {}

        def emit(i: int, record: TrialRecord) -> None:
            records[i] = record
            if on_record:
                on_record(record)

        for i, (spec, (template, config, error)) in enumerate(zip(specs, checked)):
            if error is not None:
                emit(i, self._record(spec, template, config, started, Status.INVALID_CONFIG, error))
        builds = self._build_valid(specs, checked)

        def finish(i: int, build: BuildResult, run: RunResult | None = None) -> TrialRecord:
            latency_ms = math.inf
            try:
                run_started = time.perf_counter()
                if run is not None:  # taken with the batch's: its own time is its placements' runs and waits
                    run_started -= run.run_s + run.host_wait_s
                elif build.status is Status.OK:
                    run = self._run(build, specs[i])
                status, error = (run.status, run.error) if run else (build.status, build.error)
                # A trial's own time: its build (parallel builds overlap) plus its run and bookkeeping.
                record = self._record(specs[i], checked[i][0], checked[i][1], run_started - build.build_s, status,
                                      error or "", build, run)
                latency_ms = record["latency_ms"] if status is Status.OK else math.inf
                return record
            finally:
                self._done_with(specs[i], (checked[i][0], checked[i][1], build), latency_ms)

        parallel = max((self._runner(s.resources.device).slots for s in specs), default=1)
        if parallel == 1:
            local = self._run_local(specs, builds)
            for i, build in builds.items():
                emit(i, finish(i, build, local.get(i)))
        else:
            with ThreadPoolExecutor(parallel, thread_name_prefix="opbench-remote") as pool:
                futures = {pool.submit(finish, i, build): i for i, build in builds.items()}
                for future in as_completed(futures):
                    emit(futures[future], future.result())
        return [records[i] for i in range(len(specs))]

    def _run_local(self, specs: list[TrialSpec], builds: dict[int, BuildResult]) -> dict[int, RunResult]:
        """Time the built kernels of a batch that run on this host, their placements interleaved
        (:meth:`LocalRunner.run_batch`); by spec index."""
        local = [i for i, b in builds.items() if b.status is Status.OK and specs[i].resources.device == LOCAL]
        runs = self._local.run_batch([self._run_input(builds[i], specs[i], self.timing) for i in local]) if local else []
        return dict(zip(local, runs))

    @staticmethod
    def _validate(spec: TrialSpec) -> tuple[str, Config, str | None]:
        """(template name, validated config, None), or the spec's config and why it is invalid."""
        template = get_template(spec.workload, spec.template, spec.resources.target)
        try:
            with shaped_for(spec.resources.target):  # knobs not given take the defaults of the target's CPU
                return template.name, template.validate(spec.config, spec.workload), None
        except ConfigError as exc:  # the record keeps the knobs of the space; the error names the culprit
            knobs = {k.name for k in template.knobs(spec.workload)}
            return template.name, {k: v for k, v in spec.config.items() if k in knobs}, str(exc)

    def _build_valid(self, specs: list[TrialSpec], checked: list[tuple[str, Config, str | None]]
                     ) -> dict[int, BuildResult]:
        """Build (in parallel) the specs whose configs validated; their builds by index, in order."""
        todo = [i for i, (_, _, error) in enumerate(checked) if error is None]
        inputs = [BuildInput(specs[i].workload.spec, checked[i][0], checked[i][1], specs[i].resources.target,
                             specs[i].resources.threads, self._dir, self.options.features, self.options.max_workspace)
                  for i in todo]
        return dict(zip(todo, self._builder.build(inputs)))

    def build(self, specs: list[TrialSpec]) -> list[Built]:
        """(template, validated config, build) per spec, built in parallel; invalid configs are not built (the
        caller discards the builds: :func:`~opbench.measure.builder.discard`)."""
        checked = [self._validate(spec) for spec in specs]
        builds = self._build_valid(specs, checked)
        return [(template, config, builds.get(i) or BuildResult(Status.INVALID_CONFIG, error or ""))
                for i, (template, config, error) in enumerate(checked)]

    def _runner(self, device: str) -> Runner[RunInput, RunResult]:
        """The runner of a device spec: this host's (made with the measurer), or sessions on an RPC key's devices."""
        if device not in self._runners:
            o = self.options
            self._runners[device] = RPCRunner(parse_device(device), o.remote_workers, o.run_timeout_s,
                                              o.connect_timeout_s)
        return self._runners[device]

    def corun(self, spec: CoRunSpec) -> list[TrialRecord]:
        """Time the members of a co-run alone and then together; returns [co-run record, *member records].

        Every member is built and checked first; each is timed alone (solo, same harness and window)
        and then all start at one barrier and run for the same window (see :mod:`opbench.measure.corun`).
        """
        spec.validate()
        started = time.perf_counter()
        built = self.build(list(spec.members))
        try:
            failed = next(((m, b) for m, (_, _, b) in zip(spec.members, built) if b.status is not Status.OK), None)
            if failed is None:
                kernels = tuple((m.resources, b.artifact or "", m.workload.spec) for m, (_, _, b) in zip(spec.members, built))
                outcome = self._corunner.run(CoRunInput(kernels, spec.mode, spec.window_s, spec.solo))
                solo, together = outcome.solo, outcome.together
            else:
                solo, together = None, None
        finally:
            discard(*(build for _, _, build in built))
        members = [self._record(m, template, config, started, Status.OK, "", build)
                   for m, (template, config, build) in zip(spec.members, built)]
        return corun_records(spec, members, solo, together, failed)

    def measure_library(self, workload: Workload, library: str, resources: Resources,
                        reuse_s: float = 0.0) -> TrialRecord:
        """Time a library (``torch``, ``numpy``; ``onnxruntime`` for int8) on the workload with the same threads and
        cores, each placement in a fresh process that never runs a TVM kernel (:meth:`measure_fresh`). With
        ``reuse_s``, a baseline this host measured within that many seconds is reused (``reused_from``) while a
        probe finds the host in its usual state."""
        key = baseline_key(workload, library, resources, self.host.device_key)
        if reuse_s > 0 and (known := self._baselines.get(key, reuse_s)) is not None \
                and self._local.host_usual(resources):
            return known
        record = self.measure_fresh([TrialSpec(workload, {}, resources, library)])[0]
        self._baselines.put(key, record)
        return record

    def measure_fresh(self, specs: list[TrialSpec], short: Collection[int] = (),
                      placements: int | None = None) -> list[TrialRecord]:
        """Each spec's placements each in a new process that has run nothing else (a library baseline when its
        template is in :data:`LIBRARY_TEMPLATES`), interleaved with the others' (docs/measurement.md#fresh). The
        specs at the indices ``short`` (references far slower than what they are compared with) take one short
        placement (:meth:`TimingPolicy.short`); the others ``placements`` each (default: as the timing takes them)."""
        timing = self.timing.exactly(placements)
        timings = [self.timing.short() if i in short else timing for i in range(len(specs))]
        remote = next((s.resources.device for s in specs if s.resources.remote), None)
        if remote:
            raise ResourceError(f"fresh-process measurements run on this host only, not on {remote}")
        started = time.perf_counter()
        kernels = [i for i, s in enumerate(specs) if s.template not in LIBRARY_TEMPLATES]
        kernel_specs = [specs[i] for i in kernels]
        built = dict(zip(kernels, self._kept.build(kernel_specs, self.build) if self._kept else self.build(kernel_specs)))
        jobs: dict[int, RunInput | LibraryInput] = {}
        for i, spec in enumerate(specs):
            if i not in built:
                jobs[i] = LibraryInput(spec.workload.spec, str(spec.template), timings[i], spec.resources)
            elif built[i][2].status is Status.OK:
                jobs[i] = self._run_input(built[i][2], spec, timings[i])
        try:
            runs = dict(zip(jobs, self._local.run_fresh(list(jobs.values()))))
        finally:
            if self._kept is None:
                discard(*(build for _, _, build in built.values()))
        records = []
        for i, spec in enumerate(specs):
            template, config, build = built.get(i) or (str(spec.template), {}, None)
            run = runs.get(i)
            outcome = run or build  # a library baseline always ran; a kernel that did not build has its build's
            assert outcome is not None
            records.append(self._record(spec, template, config, started, outcome.status, outcome.error, build, run))
        return records

    @contextlib.contextmanager
    def reusing_builds(self, fastest: int = 0) -> Iterator[None]:
        """Within it, :meth:`measure_fresh` builds each kernel once and loads that library in every later fresh
        process, and the builds of the ``fastest`` trials timed within it are kept for it too
        (:class:`~opbench.measure.builder.KeptBuilds`); re-entrant (the outermost block's ``fastest`` holds)."""
        if self._kept is not None:
            yield
            return
        self._kept = KeptBuilds(lambda spec: build_key(spec, *self._validate(spec)[:2]), fastest)
        try:
            yield
        finally:
            self._kept.discard()
            self._kept = None

    def time_model(self, model: ModelInput) -> RunResult:
        """A whole model timed once in this measurer's workers, as :meth:`TimingPolicy.of_models` says."""
        return self._local.run(dataclasses.replace(model, timing=self.timing.of_models()))

    def time_models_fresh(self, models: list[ModelInput], placements: int | None = None) -> list[RunResult]:
        """Whole models, each placement in a new process, as :meth:`measure_fresh` takes them (timed as :meth:`time_model`)."""
        return self._local.run_fresh([dataclasses.replace(m, timing=self.timing.of_models().exactly(placements)) for m in models])

    def profile_models(self, built: list[tuple[Path, Path]], resources: Resources, runs: int = 3) -> list[dict[str, float]]:
        """Each built model (library, inputs) profiled call by call in this measurer's workers, their placements
        interleaved: ms a model run per operator name, each the median over the placements (empty: it failed)."""
        return [run.op_ms for run in self._local.run_batch(
            [ModelProfileInput(str(library), str(inputs), runs, self.timing, resources) for library, inputs in built])]

    def time_primfunc(self, func: Any, target: Any, resources: Resources) -> float:
        """A model's operator (a PrimFunc, sent with its metadata: the IR an AMX kernel links in) compiled alone for
        ``target`` and timed on random inputs in this measurer's workers: the estimate, ms (NaN when it failed)."""
        run = self._local.run(PrimFuncInput(func.script(show_meta=True), str(target), self.timing, resources))
        if run.status is not Status.OK:
            log.warning("an operator could not be timed: %s", run.error[:300])
        return estimated_ms(run, self.timing.agree)

    def peak_gflops(self, resources: Resources, dtype: str = "float32", reached: float = 0.0) -> float | None:
        """This host's measured peak for ``resources`` (:mod:`opbench.hardware.peak`): the fastest repeat of the
        peak kernel's placements, measured once per device key, threads, cores and dtype, and again where a
        kernel ``reached`` more (GFLOP/s); None on a GPU or a remote device, for a dtype without a peak kernel here
        (:func:`~opbench.space.peak_units.peak_of`), or when it could not be measured."""
        peak = peak_units.peak_of(dtype, self.host.isa, resources.threads)
        if resources.remote or is_gpu(resources.target) or peak is None:
            return None

        def measure() -> float | None:
            timing = TimingPolicy(min_repeat_ms=self.timing.min_repeat_ms)
            run = self._local.run(PeakInput(dtype, timing, resources))
            if run.status is not Status.OK:
                log.warning("the host's peak could not be measured (no peak_frac): %s", run.error)
                return None
            return peak.work / min(run.latencies_s) / 1e9

        key = PeakCache.key(self.host.device_key, resources.threads, resources.cores_label, dtype, peak.unit)
        return self._peaks.get_or_measure(key, measure, reached)

    @staticmethod
    def _run_input(build: BuildResult, spec: TrialSpec, timing: TimingPolicy) -> RunInput:
        return RunInput(build.artifact or "", spec.workload.spec, timing, spec.resources)

    def _run(self, build: BuildResult, spec: TrialSpec) -> RunResult:
        return self._runner(spec.resources.device).run(self._run_input(build, spec, self.timing))

    def _done_with(self, spec: TrialSpec, built: Built, latency_ms: float) -> None:
        """A timed trial's build: offered to the builds kept for fresh rounds (:meth:`reusing_builds`), or deleted."""
        if self._kept is not None:
            self._kept.offer(spec, built, latency_ms)
        else:
            discard(built[2])

    def _record(self, spec: TrialSpec, template: str, config: Config, started: float, status: Status, error: str,
                build: BuildResult | None = None, run: RunResult | None = None) -> TrialRecord:
        finished_at = time.time()  # before the bookkeeping below: when the trial's run ended, give or take milliseconds
        record = new_record(spec, template, config, status, error, ran_on(self.host, spec.resources, run), build, run)
        if run is not None:
            computed = computed_flops(spec.workload, template, config, spec.resources.target)
            peak = None if run.status is not Status.OK else self.peak_gflops(  # its dtype's (None: no kernel for it)
                spec.resources, spec.workload.dtype, reached=computed / 1e6 / estimated_ms(run, self.timing.agree))
            add_run(record, run, self.timing, spec.workload.flops / 1e9, peak, self.calibration.bounds(record.device_key),
                    computed_gflop=computed / 1e9)
        record.trial_s = time.perf_counter() - started
        record.finished_at = finished_at  # unix seconds: tuning curves against wall time
        return record
