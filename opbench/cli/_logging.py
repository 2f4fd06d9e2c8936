"""The library logs (logger ``opbench``); the command shows those messages on stderr, as they were."""
from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (tests and callers may redirect it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def log_to_stderr() -> None:
    """Show the ``opbench`` logger's INFO messages on stderr, once per process."""
    logger = logging.getLogger("opbench")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
