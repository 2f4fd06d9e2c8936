"""An engine only proposes configs and hears back their records; the trial is the core loop's."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbench.exceptions import OpBenchError
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

    @abstractmethod
    def enqueue(self, config: dict[str, Any], threads: int) -> None:
        """Propose ``config`` next, before the engine's own picks, and learn its record like any other trial's
        (as Optuna's ``enqueue_trial``): how the tuning loop starts a fresh study from the template default."""

    def reject(self, proposal: Proposal, reason: str) -> None:
        """Hear that a proposal is an invalid config, found before measuring (it is not a trial)."""

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


QUEUED = object()  # the handle of a proposal an in-process engine had enqueued


class InProcessEngine(Engine):
    """An engine over ``space`` whose state lives in this process: what is enqueued waits in a queue of its own
    and is proposed before :meth:`propose`'s picks; the engine learns such a config's latency through :meth:`learn`."""

    def __init__(self, space: Space, threads: int) -> None:
        self._space, self._threads = space, threads
        self._queue: list[Proposal] = []

    def enqueue(self, config: dict[str, Any], threads: int) -> None:
        self._queue.append(Proposal(*split_threads(point_of(self._space, config, threads), threads), QUEUED))

    def ask(self, n: int) -> list[Proposal]:
        taken = self._queue[:max(n, 0)]
        del self._queue[:len(taken)]
        return [*taken, *(self.propose(n - len(taken)) if n > len(taken) else [])]

    def tell(self, proposal: Proposal, record: TrialRecord) -> None:
        if proposal.handle is not QUEUED:
            self.hear(proposal, record)
        elif is_ok(record):
            self.learn(proposal.config, proposal.threads, record["latency_ms"])

    def reject(self, proposal: Proposal, reason: str) -> None:
        if proposal.handle is not QUEUED:
            self.refuse(proposal, reason)

    @abstractmethod
    def propose(self, n: int) -> list[Proposal]:
        """Up to ``n`` configs of the engine's own choosing."""

    def hear(self, proposal: Proposal, record: TrialRecord) -> None:
        """The record of one of :meth:`propose`'s proposals (failed trials included)."""

    def learn(self, config: dict[str, Any], threads: int, latency_ms: float) -> None:
        """The latency of a config the engine did not pick (an enqueued one)."""

    def refuse(self, proposal: Proposal, reason: str) -> None:
        """One of :meth:`propose`'s proposals is an invalid config (see :meth:`Engine.reject`)."""


ArtifactSink = Callable[[TrialRecord | None, Path], None]  # a file for a trial's run (or, with None, the study's)


class LoopEngine(ABC):
    """An engine that owns its search loop (MetaSchedule's task scheduler): it is handed the measurer
    and the record sink, measures ``trials`` candidates through them and returns their records."""

    name: str

    @abstractmethod
    def run(self, workload: Workload, trials: int, measurer: Measurer, on_record: Callable[[TrialRecord], None],
            resources: Resources, on_artifact: ArtifactSink | None = None) -> list[TrialRecord]:
        """Tune; files worth keeping (a candidate's trace, the engine's database) go to ``on_artifact``."""


def space_point(space: Space, config: dict[str, Any], threads: int) -> dict[str, Any] | None:
    """``config`` with ``threads`` as a point of ``space`` (its knobs only), or None where a value it gives is not
    one of the space's; what it leaves out (a searched core set, a thread count the space does not offer) takes
    the space's first value."""
    params = {**config, "threads": threads}
    if any(k in params and params[k] not in spec["_value"] for k, spec in space.items() if k != "threads"):
        return None
    return {k: params[k] if k in params and params[k] in spec["_value"] else spec["_value"][0]
            for k, spec in space.items()}


def point_of(space: Space, config: dict[str, Any], threads: int) -> dict[str, Any]:
    """:func:`space_point`, which must be one (an error naming the config otherwise)."""
    point = space_point(space, config, threads)
    if point is None:
        raise OpBenchError(f"{config} (threads {threads}) is not a point of the engine's space")
    return point


def split_threads(config: dict[str, Any], default: int) -> tuple[dict[str, Any], int]:
    """Separate the ``threads`` pseudo-knob (searched with --search-threads) from schedule knobs."""
    config = dict(config)
    return config, int(config.pop("threads", default))
