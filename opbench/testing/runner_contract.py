"""The contract every runner keeps (:class:`~opbench.measure.runner._base.Runner`), shipped for plugin
authors whose runner times kernels somewhere else: a run is a result, never an exception; a failed run
costs that run only; warm-up and close can be called again.

Build the inputs with :func:`built_input` (the template default of a small workload, compiled here for
this host's CPU) and :func:`broken_input` (a library that is not there), then run :func:`check_runner`.
"""
from __future__ import annotations

from pathlib import Path

from opbench.hardware.resources import Resources
from opbench.measure.builder import LocalBuilder
from opbench.measure.protocol import BuildInput, RunInput, RunResult
from opbench.measure.runner._base import Runner
from opbench.measure.timing import TimingPolicy
from opbench.record import Status
from opbench.space import get_template
from opbench.workloads import parse_workload

WORKLOAD = "matmul:m=32,n=32,k=32"
ONE_THREAD = Resources(1)
QUICK = TimingPolicy(repeat=2, min_repeat_ms=1.0, placements=2, max_placements=2)


def built_input(out_dir: Path, workload: str = WORKLOAD, resources: Resources = ONE_THREAD) -> RunInput:
    """A run of ``workload``'s template default, built into ``out_dir`` by OpBench's own builder."""
    spec = parse_workload(workload)
    template = get_template(spec)
    builder = LocalBuilder(1, 120.0)
    try:
        (build,) = builder.build([BuildInput(spec.spec, template.name, template.default_config(spec), resources.target,
                                             resources.threads, str(out_dir), extract_features=False)])
    finally:
        builder.close()
    assert build.status is Status.OK and build.artifact, build.error
    return RunInput(build.artifact, spec.spec, QUICK, resources)


def broken_input(out_dir: Path, workload: str = WORKLOAD, resources: Resources = ONE_THREAD) -> RunInput:
    """A run of a kernel library that is not a library: loading it fails."""
    junk = out_dir / "not-a-kernel.so"
    junk.write_bytes(b"not an ELF file")
    return RunInput(str(junk), parse_workload(workload).spec, QUICK, resources)


def check_runner(runner: Runner[RunInput, RunResult], good: RunInput, broken: RunInput) -> None:
    """``runner`` times ``good`` (latencies, calls per repeat, the process that ran it), answers ``broken``
    with a failed result (a status and an error, no exception), times ``good`` again after it, and can be
    warmed up and closed twice."""
    runner.warm_up(good.resources)
    runner.warm_up(good.resources)
    first = runner.run(good)
    assert first.status is Status.OK, first.error
    assert first.latencies_s and all(t > 0 for t in first.latencies_s) and first.number >= 1
    failed = runner.run(broken)
    assert failed.status is not Status.OK and failed.error, "a broken kernel must be a failed result"
    again = runner.run(good)
    assert again.status is Status.OK, f"the runner did not recover from a failed run: {again.error}"
    assert runner.slots >= 1
    runner.close()
    runner.close()
