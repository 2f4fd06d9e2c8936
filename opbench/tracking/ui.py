"""The MLflow UI on a store: served on loopback, and the address of a study's runs in it.

MLflow 3 opens an experiment in its GenAI overview (traces, token usage) unless the address names its runs
table, so every address OpBench prints does (``#/experiments/<id>/runs``)."""
from __future__ import annotations

import subprocess
import sys

from opbench.exceptions import OpBenchError
from opbench.tracking.mlflow_store import _client, default_tracking_uri, ensure_store

UI_HOST = "127.0.0.1"
UI_PORT = 5000


def ui_address(port: int = UI_PORT) -> str:
    return f"http://{UI_HOST}:{port}"


def runs_url(study: str, tracking_uri: str | None = None, port: int = UI_PORT) -> str:
    """The address of ``study``'s runs table in the UI of its store (an error naming a study that is not there)."""
    uri = tracking_uri or default_tracking_uri()
    experiment = _client(uri).get_experiment_by_name(study)
    if experiment is None:
        raise OpBenchError(f"no MLflow experiment named '{study}' in {uri}")
    return f"{ui_address(port)}/#/experiments/{experiment.experiment_id}/runs"


def serve_ui(tracking_uri: str | None = None, port: int = UI_PORT) -> int:
    """Run the MLflow UI on the store (created when missing), bound to loopback, until it is stopped; its exit status."""
    uri = tracking_uri or default_tracking_uri()
    ensure_store(uri)
    return subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                            "--host", UI_HOST, "--port", str(port)])
