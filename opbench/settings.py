"""The defaults of every measurement and storage setting, in one place: :class:`MeasureOptions`, the CLI,
the NNI trial, the service protocol and the studies' specs all take theirs from here. The ``OPBENCH_*``
environment variables are read when asked, not at import: a process that sets one before it measures
gets it, and a malformed value is an error naming the variable."""
from __future__ import annotations

import os

from opbench.exceptions import OpBenchError

REPEAT = 3  # timed repeats of a placement's series (each at least MIN_REPEAT_MS)
MIN_REPEAT_MS = 50.0  # the default of min_repeat_ms()
PLACEMENTS = 3  # a trial takes at least this many placements ...
MAX_PLACEMENTS = 6  # ... and more, up to this many, until two agree within AGREE (docs/measurement.md#placements)
AGREE = 0.03
BUILD_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 60.0  # waiting for a free remote device


def min_repeat_ms() -> float:
    """Milliseconds a timed repeat lasts at least (calls per repeat are sized to it)."""
    return _number("OPBENCH_MIN_REPEAT_MS", MIN_REPEAT_MS)


def placements() -> int:
    """Placements a trial takes at least (``$OPBENCH_PLACEMENTS``; fewer: a quicker estimate with a wider
    interval, as the test suite takes them)."""
    return _count("OPBENCH_PLACEMENTS", PLACEMENTS)


def max_placements() -> int:
    """Placements a trial takes at most, until two agree (``$OPBENCH_MAX_PLACEMENTS``, never below
    :func:`placements`)."""
    return max(placements(), _count("OPBENCH_MAX_PLACEMENTS", MAX_PLACEMENTS))


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


ISOLATIONS = ("layout", "huge-pages")  # what OPBENCH_ISOLATION names, all on by default


def isolation() -> frozenset[str]:
    """The isolations worker processes apply (``$OPBENCH_ISOLATION``: comma-separated, ``none`` for none):
    ``layout``, one address-space layout without randomisation; ``huge-pages``, large arguments on huge pages
    (docs/measurement.md)."""
    text = os.environ.get("OPBENCH_ISOLATION")
    if text is None or text == "":
        return frozenset(ISOLATIONS)
    named = {part.strip() for part in text.split(",")} - {"none"}
    if unknown := named - set(ISOLATIONS):
        raise OpBenchError(f"$OPBENCH_ISOLATION names {', '.join(sorted(unknown))}; it takes {', '.join(ISOLATIONS)} or none")
    return frozenset(named)


def fixed_layout() -> bool:
    """Whether worker processes run without address-space randomisation."""
    return "layout" in isolation()


def huge_args() -> bool:
    """Whether large kernel arguments go to huge pages."""
    return "huge-pages" in isolation()


REMOVED = {  # variables of earlier releases, now an error when set: what replaced each
    "OPBENCH_SETTLE_S": "a trial no longer waits for the host's usual state: its placements outvote a spell",
    "OPBENCH_FRESH_SETTLE_S": "fresh-process measurements no longer wait for the host's usual state",
    "OPBENCH_SPELL_RERUNS": "a run in a spell is no longer taken again: it is one placement of several",
    "OPBENCH_SPELL_WAIT_S": "a run in a spell is no longer taken again: it is one placement of several",
    "OPBENCH_EXTRA_TURNS": "turns are gone: a trial takes placements until its fastest agree (--max-placements)",
    "OPBENCH_PROBE_WARM_MS": "the host-speed probe's warm-up is fixed",
    "OPBENCH_FIXED_LAYOUT": "OPBENCH_ISOLATION names the isolations: OPBENCH_ISOLATION=huge-pages keeps the rest",
    "OPBENCH_HUGE_ARGS": "OPBENCH_ISOLATION names the isolations: OPBENCH_ISOLATION=layout keeps the rest",
}


def check_environment() -> None:
    """Refuse a variable this release no longer reads, naming what replaced it (docs/measurement.md), and a
    malformed one that only worker processes read (they would fail to start)."""
    for name, why in REMOVED.items():
        if os.environ.get(name):
            raise OpBenchError(f"${name} is no longer read ({why}); unset it (docs/measurement.md)")
    isolation()


def _count(name: str, default: int) -> int:
    value = int(_number(name, default, integer=True))
    if value < 1:
        raise OpBenchError(f"${name} must be >= 1, got {value}")
    return value


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
