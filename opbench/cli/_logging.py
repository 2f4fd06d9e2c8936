"""The library logs (logger ``opbench``); the command shows those messages on stderr."""
from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a message comes (callers and tests redirect it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr, flush=True)


def log_to_stderr() -> None:
    """Show the ``opbench`` logger's INFO messages on stderr, once per process."""
    logger = logging.getLogger("opbench")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False
