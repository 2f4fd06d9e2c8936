"""A store away for a moment (a database or tracking server restarting): one call retried until it is back."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from opbench import settings

T = TypeVar("T")
log = logging.getLogger("opbench")

FIRST_DELAY_S, LONGEST_DELAY_S = 0.2, 1.0


def caused_by(exc: BaseException, test: Callable[[BaseException], bool]) -> bool:
    """Whether ``test`` holds for ``exc`` or any error in its chain of causes and contexts (drivers and clients wrap
    the connection error that says a store is away)."""
    cause: BaseException | None = exc
    while cause is not None and not test(cause):
        cause = cause.__cause__ or cause.__context__
    return cause is not None


def riding_outage(call: Callable[[], T], *, away: Callable[[Exception], bool], store: str,
                  reason: Callable[[Exception], str] = str, limit_s: float | None = None,
                  gave_up: Callable[[Exception, float], Exception] | None = None,
                  on_back: Callable[[], None] | None = None) -> T:
    """``call()``, retried with backoff while its error says the store is ``away``, for at most ``limit_s``
    (:func:`opbench.settings.storage_outage_s`) from the first such error; then ``gave_up(error, limit_s)`` is
    raised (the error itself without it). Any other error is raised at once. ``store`` names the store in the
    log (its password masked), ``reason`` an error; ``on_back`` runs when a call succeeds after an outage."""
    limit_s = settings.storage_outage_s() if limit_s is None else limit_s
    deadline, delay = None, FIRST_DELAY_S
    while True:
        try:
            result = call()
        except Exception as exc:
            if not away(exc):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + limit_s
                log.warning("%s unreachable (%s): retrying for up to %g s", store, reason(exc), limit_s)
            if now >= deadline:
                if gave_up is None:
                    raise
                raise gave_up(exc, limit_s) from None
            time.sleep(delay)
            delay = min(2 * delay, LONGEST_DELAY_S)
        else:
            if deadline is not None:
                log.warning("%s is back", store)
                if on_back is not None:
                    on_back()
            return result
