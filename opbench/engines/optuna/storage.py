"""Where Optuna studies live: a journal file on one host (the default), or a database URL.

A journal file (Optuna's ``JournalFileBackend``) is an append-only log that every process on the
host replays: an ask plus a tell costs a few ms, against ~80 ms through SQLAlchemy on sqlite, and
several processes share it without "database is locked". ``optuna-dashboard <file>`` opens it.
Ours (:class:`opbench.engines.optuna.journal_file.JournalFile`) appends under ``flock`` and without ``fsync``.
A URL (``sqlite:///``, ``postgresql://``, ``mysql://``) gives Optuna's RDB storage; sqlite runs in WAL
mode with ``synchronous=NORMAL``, which survives a killed process (not a power cut) and lets readers
such as the dashboard read while a study writes.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from opbench import settings
from opbench.exceptions import OpBenchError, StorageUnavailable
from opbench.outages import caused_by, riding_outage
from opbench.urls import driver_reason, masked, scheme

T = TypeVar("T")

JOURNAL_FILE = "optuna-journal.log"
STORAGE_ENV = "OPBENCH_STORAGE"  # the storage URL from the environment: a password stays off the command line
STORAGE_HELP = ("Optuna storage: a journal file, or a database URL (sqlite:///f.db, postgresql://...); "
                f"default: ${STORAGE_ENV}, else optuna-journal.log beside the MLflow store")
DATABASES = ("sqlite", "postgresql", "mysql")  # SQLAlchemy dialects Optuna's RDB storage supports
SQLITE_BUSY_TIMEOUT_S = 60  # several workers share one sqlite file: wait for its lock rather than fail
# A database study may be shared by worker hosts: each records a heartbeat for the trials it measures,
# and a trial whose host went silent for settings.stale_after_s() is failed and queued again (at most
# twice) by the others. A database server away mid-study (restarted, a network blip): each call is
# retried for settings.storage_outage_s(), then the study stops with StorageUnavailable (every record
# measured so far is already in its write-ahead log).


def default_storage(directory: Path) -> str:
    """The journal file of the studies kept in ``directory``."""
    return str(directory / JOURNAL_FILE)


def is_url(storage: str) -> bool:
    """A database URL (``scheme://...``) rather than a journal file's path."""
    return "://" in storage


def is_host_local(storage: str) -> bool:
    """A journal file or a sqlite database: one host's processes may share it, other hosts may not."""
    return not is_url(storage) or storage.startswith("sqlite")


def open_storage(storage: str) -> Any:
    """Optuna's storage for ``storage``: RDB for a URL, a journal for a path (created with its folder)."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats, TPE group=
    if is_url(storage):
        dialect = scheme(storage)
        if dialect not in DATABASES:
            raise OpBenchError(f"Optuna storage '{masked(storage)}': '{dialect}' is not a database Optuna stores studies "
                               f"in ({', '.join(DATABASES)}); give a URL of one, or a journal file's path")
        sqlite = storage.startswith("sqlite")
        # a server's connections die when it restarts: each is checked before use (one round trip)
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if sqlite else {"pool_pre_ping": True}
        import sqlalchemy.exc

        # A database server may be shared by hosts: heartbeats let the others retry a dead host's trials.
        shared = {} if sqlite else {"heartbeat_interval": max(1, round(settings.heartbeat_s())),
                                    "grace_period": max(1, round(settings.stale_after_s())),
                                    "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(2)}
        try:
            rdb = optuna.storages.RDBStorage(storage, engine_kwargs=kwargs, **shared)
        except sqlalchemy.exc.OperationalError as exc:  # at the start: a wrong host, port, database, user or password
            reason = driver_reason(exc, storage)
            raise OpBenchError(f"Optuna storage {masked(storage)} cannot be reached: {reason}") from None
        except (ImportError, sqlalchemy.exc.NoSuchModuleError, sqlalchemy.exc.ArgumentError) as exc:
            reason = str(exc).replace(storage, masked(storage)).strip().splitlines()[0]
            raise OpBenchError(f"Optuna storage {masked(storage)}: its database driver is not installed or the URL is "
                               f"malformed ({reason}); postgresql:// uses psycopg 3, postgresql+psycopg2:// psycopg2") from None
        if sqlite and ":memory:" not in storage:  # an in-memory database lives only in its first connection
            _tune_sqlite(rdb)
        return rdb
    from optuna.storages.journal import JournalStorage

    from opbench.engines.optuna.journal_file import JournalFile

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFile(storage))


def _tune_sqlite(storage: Any) -> None:
    """WAL and ``synchronous=NORMAL`` on every connection (the pool's first ones are dropped to get them)."""
    import sqlalchemy

    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it: Optuna wraps SQLAlchemy's errors in a StorageInternalError)
    is the database being away (connection refused or dropped, a server shutting down), not a bad
    query: SQLAlchemy's operational and interface errors, and any driver error its dialect recognises
    as a lost connection (``connection_invalidated``: psycopg2 reports some as plain DatabaseErrors)."""
    import sqlalchemy.exc

    return caused_by(exc, lambda cause: isinstance(cause, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError))
                     or getattr(cause, "connection_invalidated", False))


_last_recovery = -float("inf")  # when a call of this process last succeeded after the database was away


def recovered_within(seconds: float) -> bool:
    """Whether this process saw the database come back less than ``seconds`` ago: every host's
    heartbeats were stopped by the outage, so none is stale yet, whatever its timestamp says."""
    return time.monotonic() - _last_recovery < seconds


def _recovered() -> None:
    global _last_recovery
    _last_recovery = time.monotonic()


def riding_outages(call: Callable[[], T], storage: str, limit_s: float | None = None) -> T:
    """``call()`` (one storage operation), retried with backoff while the database is away, for at
    most ``limit_s`` (:func:`opbench.settings.storage_outage_s`); then :class:`StorageUnavailable` names the URL (its password
    masked)."""
    def gave_up(exc: Exception, limit_s: float) -> Exception:
        return StorageUnavailable(
            f"Optuna storage {masked(storage)} unreachable for {limit_s:g} s ({driver_reason(exc, storage)}); every trial "
            "measured so far is in MLflow and the log: run the same command with --resume (or the worker again) once it is back")

    return riding_outage(call, away=is_outage, store=f"Optuna storage {masked(storage)}", limit_s=limit_s,
                         reason=lambda exc: driver_reason(exc, storage), gave_up=gave_up, on_back=_recovered)
