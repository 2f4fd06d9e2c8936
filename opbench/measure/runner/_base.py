"""The runner interface (as MetaSchedule's ``runner/runner.py``): one signature, ``run(input) -> result``,
for every way a built kernel or a library baseline is timed (local, RPC, co-run); the resources it
runs with are inside its input."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from opbench.hardware.resources import Resources

InputT = TypeVar("InputT", contravariant=True)
ResultT = TypeVar("ResultT", covariant=True)


class Runner(ABC, Generic[InputT, ResultT]):
    """Times one input at a time (callers may call from several threads up to :attr:`slots`)."""

    @abstractmethod
    def run(self, inp: InputT) -> ResultT:
        """Time ``inp``; a crash, a hang or a lost device is a result with its status, never an exception."""

    def warm_up(self, resources: Resources | None = None) -> None:
        """Start what :meth:`run` will need (workers, sessions) so that start-up is not charged to a trial."""

    @property
    def slots(self) -> int:
        """Inputs this runner can time at once."""
        return 1

    @abstractmethod
    def close(self) -> None:
        """Stop the runner's processes and sessions."""
