"""What a client asks the service for: one trial (and, for an experiment's first, the references)."""
from __future__ import annotations

from dataclasses import dataclass, field
from multiprocessing.managers import BaseManager
from typing import Any

from opbench import settings


@dataclass(frozen=True)
class TrialRequest:
    """Everything the service needs to measure and record one trial; plain values only."""

    workload: str
    config: dict[str, Any]
    threads: int = 1
    cores: str | None = None
    target: str = "llvm"
    device: str = "local"
    template: str | None = None
    repeat: int = settings.REPEAT
    build_timeout_s: float = settings.BUILD_TIMEOUT_S
    run_timeout_s: float = settings.RUN_TIMEOUT_S
    study: str | None = None  # MLflow experiment (default nni-<workload>)
    tracking_uri: str | None = None
    log: str | None = None  # JSON-lines log, beside MLflow
    engine: str = "nni"
    nni_experiment: str = ""
    nni_trial: str = ""
    nni_sequence: int = 0  # the trial's number in its experiment (recorded as engine_trial)
    references: bool = False  # also measure the references (an experiment's first trial)
    tags: dict[str, str] = field(default_factory=dict)


class ServiceClosing(RuntimeError):
    """The service has begun to exit (idle past its timeout) and takes no more calls: nothing of this call was
    measured, and the client asks the service that follows it."""


@dataclass(frozen=True)
class TrialReply:
    record: dict[str, Any] | None  # None when the request itself was bad or its store never answered
    error: str = ""  # a bad request (unknown workload, knob, ...) or an unreachable store: the trial is a usage error


class ServiceManager(BaseManager):
    """The manager both sides use: the server registers the service object, the client its proxy."""
