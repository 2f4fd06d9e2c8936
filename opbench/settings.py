"""The defaults of every measurement and storage setting, in one place: :class:`MeasureOptions`, the CLI,
the NNI trial, the service protocol and the studies' specs all take theirs from here. The ``OPBENCH_*``
environment variables are read when asked, not at import: a process that sets one before it measures
gets it, and a malformed value is an error naming the variable."""
from __future__ import annotations

import os

from opbench.exceptions import OpBenchError

REPEAT = 5  # timed repeats of a series (each at least MIN_REPEAT_MS)
MIN_REPEAT_MS = 50.0  # the default of min_repeat_ms()
MAX_CV = 0.05  # a series whose repeats vary more is measured again ...
MAX_REMEASURES = 2  # ... at most this many times; the steadiest kept
TURNS = 3  # the trials of a batch take their repeats in this many interleaved turns (and extra_turns() more)
FRESH_TURNS = 4  # a fresh-process measurement takes this many turns of a trial's series, interleaved
BUILD_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 60.0  # waiting for a free remote device


def settle_s() -> float:
    """Seconds a trial waits at most for the host's usual speed before it is timed (0: only record it)."""
    return _number("OPBENCH_SETTLE_S", 0.0)


def fresh_settle_s() -> float:
    """The longest wait for the host's usual speed, in all, of a fresh-process measurement's turns."""
    return _number("OPBENCH_FRESH_SETTLE_S", 10.0)


def spell_reruns() -> int:
    """Times a short run that the host-speed probes found outside the host's usual state is taken again."""
    return int(_number("OPBENCH_SPELL_RERUNS", 1, integer=True))


def min_repeat_ms() -> float:
    """Milliseconds a timed repeat lasts at least (calls per repeat are sized to it)."""
    return _number("OPBENCH_MIN_REPEAT_MS", MIN_REPEAT_MS)


def extra_turns() -> int:
    """Turns a trial takes beyond its own when its turns disagree by more than MAX_CV."""
    return int(_number("OPBENCH_EXTRA_TURNS", 2, integer=True))


def probe_warm_ms() -> float:
    """Milliseconds each host-speed probe keeps its cores busy before it times (docs/measurement.md#probes)."""
    return _number("OPBENCH_PROBE_WARM_MS", 10.0)


def spell_wait_s() -> float:
    """Seconds such a rerun waits at most for the host's usual state."""
    return _number("OPBENCH_SPELL_WAIT_S", 0.5)


def baseline_reuse_s() -> float:
    """Seconds a library baseline measured on this host is reused by later studies' references (0: never)."""
    return _number("OPBENCH_BASELINE_REUSE_S", 3600.0)


def stale_after_s() -> float:
    """Seconds without a heartbeat after which a shared study's trial is failed and asked again."""
    return _number("OPBENCH_STALE_AFTER_S", 30.0)


def heartbeat_s() -> float:
    """How often a process records a heartbeat for its trials in flight."""
    return max(0.1, stale_after_s() / 6)


def storage_outage_s() -> float:
    """Seconds each storage call is retried while the database is away."""
    return _number("OPBENCH_STORAGE_OUTAGE_S", 60.0)


def lock_wait_s() -> float:
    """Seconds a timed run waits at most for the host timing lock (longer than any run's timeout)."""
    return _number("OPBENCH_LOCK_WAIT_S", 900.0)


def fixed_layout() -> bool:
    """Whether worker processes run without address-space randomisation (``OPBENCH_FIXED_LAYOUT=0`` turns it off)."""
    return os.environ.get("OPBENCH_FIXED_LAYOUT", "1") != "0"


def huge_args() -> bool:
    """Whether large kernel arguments go to huge pages (``OPBENCH_HUGE_ARGS=0`` turns it off)."""
    return os.environ.get("OPBENCH_HUGE_ARGS", "1") != "0"


def _number(name: str, default: float, integer: bool = False) -> float:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise OpBenchError(f"${name} must be {'an integer' if integer else 'a number'}, got {text!r}") from None
    if value < 0:
        raise OpBenchError(f"${name} must be >= 0, got {text!r}")
    return value
