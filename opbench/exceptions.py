"""Every error OpBench raises on bad input, in one place.

Each names the offending thing (operator, key, knob, file) so a user can fix the input without
reading a traceback. The CLI turns any :class:`OpBenchError` into its ``exit_code``: 2 (bad input) unless it says otherwise.
"""
from __future__ import annotations


class OpBenchError(Exception):
    """Base class of all user-facing OpBench errors."""

    exit_code = 2


class WorkloadError(OpBenchError, ValueError):
    """Unknown operator or preset, missing or malformed shape key."""


class ConfigError(OpBenchError, ValueError):
    """A schedule config that cannot apply to a workload; ``knob`` names the culprit."""

    def __init__(self, knob: str, message: str) -> None:
        super().__init__(f"knob '{knob}': {message}")
        self.knob = knob


class SearchSpaceError(OpBenchError, ValueError):
    """A malformed or unreadable NNI-format search space file."""


class ResourceError(OpBenchError, ValueError):
    """Threads, core sets or targets that this host cannot provide."""


class StorageUnavailable(OpBenchError):
    """A study's database went away mid-study for longer than OpBench waits for it (not bad input)."""

    exit_code = 1


class StudyInterrupted(OpBenchError):
    """A study stopped before its budget (a worker process killed): resume it."""

    exit_code = 1


class UnsafePathError(OpBenchError, PermissionError):
    """A file or folder in a place other users can write (``/tmp``) that is not safely this user's."""
