"""Reading records back from MLflow run by run: each finished trial run's params, metrics and tags, and
its features artifact (read in place from a local artifact store, else through the tracking server)."""
from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.paths import default_tracking_uri
from opbench.record import TrialRecord, from_mlflow_value
from opbench.tracking.mlflow_store import FEATURES_FILE, FEATURES_TAG, KIND_TAG, _client
from opbench.tracking.row import Row


def read_mlflow(experiments: list[str], tracking_uri: str | None = None,
                parent_run_id: str | None = None, kind: str = "trial") -> pd.DataFrame:
    """Trial records of the named experiments (studies) from an MLflow store, as a DataFrame
    (only those of one parent run, i.e. one invocation of a study, when ``parent_run_id`` is given;
    the co-runs' own records with ``kind="corun"``)."""
    from opbench.tracking.jsonl import records_frame

    return records_frame(_rows(experiments, tracking_uri, parent_run_id, kind))


def read_mlflow_records(experiments: list[str], tracking_uri: str | None = None,
                        parent_run_id: str | None = None, kind: str = "trial") -> list[TrialRecord]:
    """Like :func:`read_mlflow`, as records with their original types, oldest first."""
    return [TrialRecord.from_row(row) for row in _rows(experiments, tracking_uri, parent_run_id, kind)]


def _rows(experiments: list[str], tracking_uri: str | None, parent_run_id: str | None, kind: str) -> list[Row]:
    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    query = f"tags.`{KIND_TAG}` = '{kind}'"
    if parent_run_id:
        query += f" and tags.`mlflow.parentRunId` = '{parent_run_id}'"
    return list(runs_records(client, experiment_ids(client, experiments, uri), query))


def experiment_ids(client: Any, experiments: list[str], uri: str) -> list[str]:
    """The ids of the named experiments (a clear error naming one that is not there)."""
    ids = []
    for name in experiments:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            from opbench.exceptions import OpBenchError

            raise OpBenchError(f"no MLflow experiment named '{name}' in {uri}")
        ids.append(exp.experiment_id)
    return ids


def runs_records(client: Any, experiment_ids: list[str], query: str, skip: set[str] | frozenset[str] = frozenset()
                 ) -> Iterator[Row]:
    """The records of the finished runs ``query`` finds, oldest first, but for those whose trial id is in
    ``skip`` (their features are not even fetched)."""
    token = None
    while True:
        page = client.search_runs(experiment_ids, filter_string=query, max_results=5000,
                                  order_by=["attributes.start_time ASC"], page_token=token)
        for run in page:
            if run.info.status == "RUNNING" or run.data.tags.get("trial_id") in skip:  # RUNNING: a writer
                continue  # killed between creating the run and terminating it
            data = {**run.data.params, **run.data.metrics,
                    **{k: v for k, v in run.data.tags.items() if not k.startswith(("mlflow.", "opbench."))}}
            if FEATURES_TAG in run.data.tags:
                data.update(_read_features(client, run))
            yield {k: from_mlflow_value(k, v) for k, v in data.items()}
        token = page.token
        if not token:
            return


def verified_claims(experiments: list[str], tracking_uri: str | None = None) -> dict[str, dict[str, float]]:
    """The verified speed-ups (``verified_speedup_vs_<name>`` with ``_min`` and ``_max``) of the studies' parent runs,
    by the trial id of the best they verified; the latest run's where several verified the same best."""
    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    runs = client.search_runs(experiment_ids(client, experiments, uri), filter_string=f"tags.`{KIND_TAG}` = 'study'",
                              order_by=["attributes.start_time ASC"])
    return {run.data.tags["verified_best_trial"]: {k: v for k, v in run.data.metrics.items()
                                                    if k.startswith("verified_speedup_vs_")}
            for run in runs if "verified_best_trial" in run.data.tags}


def latest_parent_run(study: str, tracking_uri: str | None = None) -> str:
    """The run id of the study's most recent parent run (``opbench tune`` makes one per invocation)."""
    from opbench.exceptions import OpBenchError

    uri = tracking_uri or default_tracking_uri()
    client = _client(uri)
    exp = client.get_experiment_by_name(study)
    if exp is None:
        raise OpBenchError(f"no MLflow experiment named '{study}' in {uri}")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'study'", max_results=1,
                              order_by=["attributes.start_time DESC"])
    if not runs:
        raise OpBenchError(f"no study run in MLflow experiment '{study}' of {uri}")
    return runs[0].info.run_id


def _read_features(client: Any, run: Any) -> dict[str, Any]:
    """The feat.* columns and lists a run keeps in its artifact (read in place when the artifact store is local,
    else through the tracking server)."""
    local = urllib.parse.urlparse(run.info.artifact_uri)
    if local.scheme in ("", "file"):
        return json.loads((Path(urllib.parse.unquote(local.path)) / FEATURES_FILE).read_text())
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # not one bar per run read back
    with tempfile.TemporaryDirectory() as scratch:
        return json.loads(Path(client.download_artifacts(run.info.run_id, FEATURES_FILE, scratch)).read_text())
