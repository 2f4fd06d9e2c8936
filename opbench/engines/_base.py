"""An engine only proposes configs and hears back their records; the trial is the core loop's."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbench.record import TrialRecord, is_ok

if TYPE_CHECKING:
    from opbench.hardware.resources import Resources
    from opbench.measure.measurer import Measurer
    from opbench.workloads import Workload

Space = dict[str, dict[str, Any]]  # NNI search-space format


@dataclass
class Proposal:
    """A config to measure, with the engine's own handle to tell the result back."""

    config: dict[str, Any]
    threads: int
    handle: Any = None


class Engine(ABC):
    """The contract every engine keeps (``tests/test_engine_contract.py`` checks it for each one)."""

    name: str
    rejected: int = 0  # invalid configs handed back by :meth:`reject` (counted by the tuning loop)
    objectives: tuple[str, ...] = ("latency",)  # what :meth:`tell` minimises; more than one: a Pareto front

    @abstractmethod
    def ask(self, n: int) -> list[Proposal]:
        """Up to ``n`` proposals (fewer when the engine's space or budget is exhausted)."""

    @abstractmethod
    def tell(self, proposal: Proposal, record: TrialRecord) -> None:
        """Report the record of a proposal (failed trials included, with their status)."""

    def reject(self, proposal: Proposal, reason: str) -> None:
        """Hear that a proposal is an invalid config, found before measuring (it is not a trial)."""

    def observe(self, config: dict[str, Any], threads: int, latency_ms: float) -> None:
        """Learn a measured config the engine did not propose (the template default, measured first)."""

    @property
    def done(self) -> int:
        """Trials already finished in earlier sessions of a resumed study."""
        return 0

    def recover(self, recorded: dict[str, TrialRecord]) -> list[TrialRecord]:
        """Resume: hear the records of trials of an earlier session (keyed by engine trial) that the
        engine never heard; returns those it took. Engines without resumable state take none."""
        return []

    def close(self) -> None:
        """Release the engine's resources."""


ArtifactSink = Callable[[TrialRecord | None, Path], None]  # a file for a trial's run (or, with None, the study's)


class LoopEngine(ABC):
    """An engine that owns its search loop (MetaSchedule's task scheduler): it is handed the measurer
    and the record sink, measures ``trials`` candidates through them and returns their records."""

    name: str

    @abstractmethod
    def run(self, workload: Workload, trials: int, measurer: Measurer, on_record: Callable[[TrialRecord], None],
            resources: Resources, on_artifact: ArtifactSink | None = None) -> list[TrialRecord]:
        """Tune; files worth keeping (a candidate's trace, the engine's database) go to ``on_artifact``."""


DEFAULT = "default"  # the handle of the proposal :class:`DefaultFirst` adds


class DefaultFirst(Engine):
    """Proposes the template default as the first trial of a fresh study, then the wrapped engine's
    configs; the wrapped engine learns the default's latency (:meth:`Engine.observe`). A study's best
    is then never worse than the default it reports against."""

    def __init__(self, engine: Engine, default: dict[str, Any], threads: int) -> None:
        self.engine, self.name, self.objectives = engine, engine.name, engine.objectives
        self._pending = None if engine.done else Proposal(default, threads, DEFAULT)

    def ask(self, n: int) -> list[Proposal]:
        if self._pending is None or n < 1:
            return self.engine.ask(n)
        first, self._pending = self._pending, None
        return [first, *self.engine.ask(n - 1)]

    def tell(self, proposal: Proposal, record: TrialRecord) -> None:
        if proposal.handle is not DEFAULT:
            self.engine.tell(proposal, record)
        elif is_ok(record):
            self.engine.observe(proposal.config, proposal.threads, record["latency_ms"])

    def reject(self, proposal: Proposal, reason: str) -> None:
        if proposal.handle is not DEFAULT:
            self.engine.reject(proposal, reason)

    @property
    def done(self) -> int:
        return self.engine.done

    def recover(self, recorded: dict[str, TrialRecord]) -> list[TrialRecord]:
        return self.engine.recover(recorded)

    def close(self) -> None:
        self.engine.close()


def space_point(space: Space, config: dict[str, Any], threads: int) -> dict[str, Any] | None:
    """``config`` with ``threads`` as a point of ``space`` (its knobs only), or None where it is not one."""
    params = {**config, "threads": threads}
    if all(k in params and params[k] in spec["_value"] for k, spec in space.items()):
        return {k: params[k] for k in space}
    return None


def split_threads(config: dict[str, Any], default: int) -> tuple[dict[str, Any], int]:
    """Separate the ``threads`` pseudo-knob (searched with --search-threads) from schedule knobs."""
    config = dict(config)
    return config, int(config.pop("threads", default))
