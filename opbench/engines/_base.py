"""An engine only proposes configs and hears back their records; the trial is the core loop's."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from opbench.record import Record

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
    def tell(self, proposal: Proposal, record: Record) -> None:
        """Report the record of a proposal (failed trials included, with their status)."""

    def reject(self, proposal: Proposal, reason: str) -> None:
        """Hear that a proposal is an invalid config, found before measuring (it is not a trial)."""

    @property
    def done(self) -> int:
        """Trials already finished in earlier sessions of a resumed study."""
        return 0

    def recover(self, recorded: dict[str, Record]) -> list[Record]:
        """Resume: hear the records of trials of an earlier session (keyed by engine trial) that the
        engine never heard; returns those it took. Engines without resumable state take none."""
        return []

    def pareto_trial_ids(self) -> set[str]:
        """Trial ids on the Pareto front of a multi-objective study (empty for one objective)."""
        return set()

    def close(self) -> None:
        """Release the engine's resources."""


def split_threads(config: dict[str, Any], default: int) -> tuple[dict[str, Any], int]:
    """Separate the ``threads`` pseudo-knob (searched with --search-threads) from schedule knobs."""
    config = dict(config)
    return config, int(config.pop("threads", default))
