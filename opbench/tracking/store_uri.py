"""A tracking URI checked before MLflow uses it: MLflow answers an unreachable server or database by
retrying for minutes, then a traceback, and MLflow 3 refuses file stores (``./mlruns``) unless told."""
from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from opbench.exceptions import OpBenchError
from opbench.outages import caused_by, riding_outage
from opbench.urls import driver_reason, masked, scheme

T = TypeVar("T")

DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # SQLAlchemy dialects MLflow keeps runs in
SERVERS = {"http": 80, "https": 443}
CONNECT_TIMEOUT_S = 10
FILE_STORE_ENV = "MLFLOW_ALLOW_FILE_STORE"  # MLflow's own opt-in to its file store


class StoreUnreachable(OpBenchError):
    """A tracking server or database did not answer: away for a while, or a wrong address."""


@functools.cache
def check_tracking_uri(uri: str) -> None:
    """Raise :class:`OpBenchError` naming what is wrong with ``uri`` (its password masked): a file store
    MLflow will not write, a scheme it has no store for, or a server or database that does not answer."""
    kind = scheme(uri)
    if kind in ("", "file"):
        if os.environ.get(FILE_STORE_ENV, "").lower() not in ("1", "true"):
            raise OpBenchError(f"tracking URI '{masked(uri)}' is a file store, which MLflow 3 no longer writes: use a "
                               "database, e.g. sqlite:///mlflow.db (`mlflow migrate-filestore` moves an existing "
                               f"./mlruns into one), or set {FILE_STORE_ENV}=true to keep it")
    elif kind in SERVERS:
        _reach_server(uri, kind)
    elif kind in DATABASES:
        if kind != "sqlite":
            _reach_database(uri)
    elif not kind.startswith("databricks"):
        raise OpBenchError(f"tracking URI '{masked(uri)}': MLflow has no store for '{kind}://'; give a database "
                           f"({', '.join(d + '://' for d in DATABASES)}) or a tracking server (http(s)://HOST:PORT)")


def _reach_server(uri: str, kind: str) -> None:
    parts = urlsplit(uri)
    try:
        socket.create_connection((parts.hostname or "", parts.port or SERVERS[kind]), CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise StoreUnreachable(f"MLflow tracking server {masked(uri)} cannot be reached: {exc}") from None


def _reach_database(uri: str) -> None:
    import sqlalchemy

    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if scheme(uri) in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
        with engine.connect():
            pass
        engine.dispose()
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as exc:
        raise StoreUnreachable(f"MLflow tracking database {masked(uri)} cannot be reached: {driver_reason(exc, uri)}") from None


SERVER_OUTAGE_CODES = ("TEMPORARILY_UNAVAILABLE", "SERVICE_UNDER_MAINTENANCE")  # an MLflow server's: its database away


def is_store_outage(exc: Exception) -> bool:
    """Whether ``exc`` says the tracking store is away for a moment: not reached, a server that dropped the
    connection (MLflow's REST client raises a plain ``MlflowException`` in the context of requests' connection
    error, and does not retry a request in flight), or an MLflow server answering that its own database is away
    (once MLflow's client has spent its retries)."""
    import requests

    if isinstance(exc, StoreUnreachable) or getattr(exc, "error_code", None) in SERVER_OUTAGE_CODES:
        return True
    return caused_by(exc, lambda cause: isinstance(cause, requests.exceptions.ConnectionError))


class RidingClient:
    """A tracking client (MLflow's ``MlflowClient``) whose every call waits out a store that is away for a moment
    (:func:`riding_store_outage`): a running study's writes of records, segments and summaries alike."""

    def __init__(self, client: Any) -> None:
        self.wrapped = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.wrapped, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def riding(*args: Any, **kwargs: Any) -> Any:
            return riding_store_outage(lambda: attr(*args, **kwargs))

        return riding


def riding_store_outage(call: Callable[[], T], limit_s: float | None = None) -> T:
    """``call()`` (which opens or writes to a tracking store) retried with backoff while the store is away
    (:func:`is_store_outage`), for at most ``limit_s`` (:func:`opbench.settings.storage_outage_s`); then its last
    error. For work inside a running experiment, whose store a restart may take away for a moment; a command's
    first contact names an unreachable store at once instead."""
    return riding_outage(call, away=is_store_outage, store="MLflow tracking store", limit_s=limit_s)
