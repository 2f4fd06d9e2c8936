"""What a trial is asked to measure: :class:`TrialSpec` and :class:`MeasureOptions` (the builder's and the
runner's own inputs and results are the wire protocol, :mod:`opbench.measure.protocol`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opbench import settings
from opbench.hardware.lock import DEFAULT_LOCK
from opbench.hardware.resources import Resources
from opbench.measure.timing import TimingPolicy
from opbench.space import Config
from opbench.workloads import Workload


@dataclass(frozen=True)
class TrialSpec:
    """What to measure: a workload under a config (knob values) with some resources."""

    workload: Workload
    config: Config = field(default_factory=dict, hash=False)
    resources: Resources = Resources()
    template: str | None = None  # None: the op's default template (opbench.space.get_template)
    tags: dict[str, str] = field(default_factory=dict, hash=False)  # stamped on the record (engine ids)


@dataclass
class MeasureOptions:
    """Every measurement setting of a :class:`~opbench.measure.measurer.Measurer`: how runs are timed
    (:class:`~opbench.measure.timing.TimingPolicy`), built and run, and where."""

    timing: TimingPolicy = field(default_factory=TimingPolicy)
    build_timeout_s: float = settings.BUILD_TIMEOUT_S
    run_timeout_s: float = settings.RUN_TIMEOUT_S
    build_workers: int = 1
    max_workspace: int | None = None  # bytes of workspace a schedule may allocate (None: any); more is invalid_config
    features: bool = True
    lock_path: Path = DEFAULT_LOCK
    remote_workers: int = 1  # sessions held on a remote device's key: trials at once on as many devices
    connect_timeout_s: float = settings.CONNECT_TIMEOUT_S  # waiting for a free remote device
