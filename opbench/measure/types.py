"""What a trial is asked to measure: :class:`TrialSpec` and :class:`MeasureOptions` (the builder's and the
runner's own inputs and results are the wire protocol, :mod:`opbench.measure.protocol`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opbench import settings
from opbench.hardware.lock import DEFAULT_LOCK
from opbench.hardware.resources import Resources
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


# A batch's trials on this host take their repeats in this many turns, interleaved with each other's
# (Measurer.measure_batch): the median of three turns stands when one of them fell in a spell of the host.


@dataclass
class MeasureOptions:
    repeat: int = settings.REPEAT
    min_repeat_ms: float = settings.MIN_REPEAT_MS
    max_cv: float = settings.MAX_CV  # repeats varying more than this are measured again, at most max_remeasures times
    max_remeasures: int = settings.MAX_REMEASURES
    cache_flush: bool = False  # evict CPU caches before every timed call (AutoTVM's enable_cpu_cache_flush)
    settle_s: float = field(default_factory=settings.settle_s)  # the longest wait for the host's usual speed
    spell_reruns: int = field(default_factory=settings.spell_reruns)  # a short run found in a spell, taken again
    turns: int = settings.TURNS  # a batch's local trials take this many interleaved turns, sharing the repeats
    build_timeout_s: float = settings.BUILD_TIMEOUT_S
    run_timeout_s: float = settings.RUN_TIMEOUT_S
    build_workers: int = 1
    features: bool = True
    lock_path: Path = DEFAULT_LOCK
    remote_workers: int = 1  # sessions held on a remote device's key: trials at once on as many devices
    connect_timeout_s: float = settings.CONNECT_TIMEOUT_S  # waiting for a free remote device
