"""A tracking URI checked before MLflow uses it: MLflow answers an unreachable server or database by
retrying for minutes, then a traceback, and MLflow 3 refuses file stores (``./mlruns``) unless told."""
from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlsplit

from opbench.exceptions import OpBenchError
from opbench.urls import driver_reason, masked, scheme

DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # SQLAlchemy dialects MLflow keeps runs in
SERVERS = {"http": 80, "https": 443}
CONNECT_TIMEOUT_S = 10
FILE_STORE_ENV = "MLFLOW_ALLOW_FILE_STORE"  # MLflow's own opt-in to its file store


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
        raise OpBenchError(f"MLflow tracking server {masked(uri)} cannot be reached: {exc}") from None


def _reach_database(uri: str) -> None:
    import sqlalchemy

    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if scheme(uri) in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
        with engine.connect():
            pass
        engine.dispose()
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as exc:
        raise OpBenchError(f"MLflow tracking database {masked(uri)} cannot be reached: {driver_reason(exc, uri)}") from None
