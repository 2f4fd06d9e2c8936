"""The MLflow UI on a store: served on loopback, and the address of a study's runs in it.

MLflow 3 opens an experiment in its GenAI overview (traces, token usage) unless the address names its runs
table, so every address OpBench prints does (``#/experiments/<id>/runs``)."""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys

from opbench.exceptions import OpBenchError
from opbench.tracking.mlflow_store import _client, default_tracking_uri, ensure_store
from opbench.urls import masked, scheme

UI_HOST = "127.0.0.1"
UI_PORT = 5000


def ui_address(port: int = UI_PORT) -> str:
    return f"http://{UI_HOST}:{port}"


def _is_server(uri: str) -> bool:
    return scheme(uri) in ("http", "https")


def runs_url(study: str, tracking_uri: str | None = None, port: int = UI_PORT) -> str:
    """The address of ``study``'s runs table in the UI of its store: a tracking server's own, else the one
    :func:`serve_ui` starts on ``port`` (an error naming a study that is not there)."""
    uri = tracking_uri or default_tracking_uri()
    experiment = _client(uri).get_experiment_by_name(study)
    if experiment is None:
        raise OpBenchError(f"no MLflow experiment named '{study}' in {masked(uri)}")
    return f"{uri.rstrip('/') if _is_server(uri) else ui_address(port)}/#/experiments/{experiment.experiment_id}/runs"


def how_to_open(study: str, tracking_uri: str, program: str = "opbench") -> str:
    """How a user opens ``study``'s runs: a tracking server's address, or the ``ui`` command of ``program`` to
    type (``--tracking-uri`` only when it is not the default, its password masked) and the address it serves."""
    if _is_server(tracking_uri):
        return f"open its runs: {masked(runs_url(study, tracking_uri))}"
    command = [program, "ui", study] + (["--tracking-uri", masked(tracking_uri)]
                                          if tracking_uri != default_tracking_uri() else [])
    return f"open its runs: {shlex.join(command)}, then {runs_url(study, tracking_uri)}"


def serve_ui(tracking_uri: str | None = None, port: int = UI_PORT) -> int:
    """Run the MLflow UI on the store (created when missing), bound to loopback, until it is stopped; its exit
    status. The store's URL reaches MLflow through its environment, not argv, which every user can read.
    MLflow's server runs in a process group of its own, stopped whole however this call ends (its web workers
    and job runners outlive the ``mlflow`` process that started them)."""
    uri = tracking_uri or default_tracking_uri()
    ensure_store(uri)
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--host", UI_HOST, "--port", str(port)],
                              env={**os.environ, "MLFLOW_BACKEND_STORE_URI": uri}, start_new_session=True)
    try:
        return server.wait()
    finally:
        _stop_group(server)


def _stop_group(leader: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to ``leader``'s process group, then, once it has exited or ``grace_s`` passed, SIGKILL to
    whatever of the group is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(grace_s)
