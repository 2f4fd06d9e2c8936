"""Database and server URLs as messages may show them: passwords masked, a driver's reason in one line."""
from __future__ import annotations

import re

_PASSWORD = re.compile(r"^([a-z0-9+.-]+://[^:/@]*:)[^@]*@", re.IGNORECASE)


def masked(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``: what messages and logs may print."""
    return _PASSWORD.sub(r"\1***@", url)


def scheme(url: str) -> str:
    """The URL's scheme without its driver (``postgresql+psycopg2://`` -> ``postgresql``); "" for a path."""
    return url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""


def driver_reason(exc: BaseException, url: str) -> str:
    """The driver's first line about why a call to ``url`` failed, its password masked."""
    cause = exc.__cause__ or exc
    text = str(getattr(cause, "orig", None) or getattr(exc, "orig", None) or cause).strip()
    return (text.splitlines() or [type(exc).__name__])[0].replace(url, masked(url))
