"""MLflow side of tracking: one experiment per study, a parent run, one nested run per trial."""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.hardware.lock import HostLock
from opbench.lifecycle import fault_point
from opbench.paths import default_tracking_uri, safe_name, store_dir
from opbench.record import JSON_TAGS, is_ok, kind_of
from opbench.tracking.row import Row
from opbench.tracking.segment_store import INVOCATION_TAG, OPEN, SEALED, upload_segment, writer_name
from opbench.tracking.segments import write_segment
from opbench.tracking.store_uri import RidingClient, check_tracking_uri
from opbench.tracking.writer import BackgroundWriter
from opbench.urls import driver_reason, masked

log = logging.getLogger("opbench")

KIND_TAG = "opbench.kind"  # "study" for parent runs, "trial" for trial runs, "corun" for co-runs
FEATURES_TAG = "opbench.features"  # on a run whose feat.* columns are in its artifact FEATURES_FILE
FEATURES_FILE = "features.json"


def study_dir(kind: str, study: str, tracking_uri: str | None = None) -> Path:
    """``<store>/<kind>/<study>``: a study's files that are not runs (plots, tuner state), next to the
    sqlite store it logs to (``mlflow/`` by default)."""
    uri = tracking_uri or default_tracking_uri()
    base = Path(uri.removeprefix("sqlite:///")).parent if uri.startswith("sqlite:///") else store_dir()
    return base / kind / safe_name(study)


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    check_tracking_uri(uri)
    # MLflow writes "View run ... at: URL" to stdout for each run it ends on a tracking server: that
    # would break `--json` output and bury the tables (the study's experiment is named at the end).
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_store(uri: str) -> Any:
    """A client of the store at ``uri``, which has answered once; a sqlite store is created (and migrated)
    under a lock first, before any concurrent writer uses it."""
    sqlite = uri.startswith("sqlite:///")
    with _file_lock(Path(uri.removeprefix("sqlite:///")).with_suffix(".init.lock")) if sqlite else contextlib.nullcontext():
        client = _client(uri)
        from mlflow.exceptions import MlflowException

        try:
            client.search_experiments(max_results=1)
        except MlflowException as exc:  # a server that is not MLflow's, or one that refuses us
            raise OpBenchError(f"MLflow tracking store {masked(uri)} answered with an error: "
                               f"{driver_reason(exc, uri)}") from None
    return client


def experiment_id(client: Any, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts" / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _split(record: Row) -> tuple[list[Any], list[Any], dict[str, str], dict[str, Any]]:
    """A record as MLflow params, metrics and tags, and what goes to the run's artifact: the features and
    the lists (raw latencies), which MLflow would truncate as tags (8,000 characters)."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    params, metrics, tags = [], [], {}
    features: dict[str, Any] = {}
    for key, value in record.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        kind = kind_of(key)
        if kind == "param":
            params.append(Param(key, str(value)))
        elif kind == "metric":
            metrics.append(Metric(key, float(value), now, 0))
        elif kind == "feature":
            features[key] = float(value)
        elif key in JSON_TAGS:
            features[key] = list(value)
        else:
            tags[key] = str(value)
    return params, metrics, tags, features


def nni_parent_run(study: str, tracking_uri: str | None, nni_experiment: str) -> str:
    """The parent run that gathers one NNI experiment's trials (created by whichever trial comes first)."""
    uri = tracking_uri or default_tracking_uri()
    client = ensure_store(uri)
    exp = experiment_id(client, study, uri)
    lock = Path(uri.removeprefix("sqlite:///")).with_suffix(".nni.lock") if uri.startswith("sqlite:///") \
        else Path(os.path.expanduser("~/.opbench-nni.lock"))
    with _file_lock(lock):
        runs = client.search_runs([exp], filter_string=f"tags.`{KIND_TAG}` = 'study' and "
                                                       f"tags.`nni.experiment_id` = '{nni_experiment}'")
        if runs:
            return runs[0].info.run_id
        tags = {KIND_TAG: "study", "mlflow.runName": f"{study}-nni-{nni_experiment}", "nni.experiment_id": nni_experiment}
        return client.create_run(exp, tags=tags).info.run_id


class MlflowWriter:
    """Logs each record as a nested run in three calls (create with tags, log_batch, terminate), in the
    calling thread or, given the host timing lock, in a background thread (:class:`BackgroundWriter`);
    the parent run's logging then waits for the trials written before it."""

    def __init__(self, study: str, tracking_uri: str | None = None, parent_name: str | None = None,
                 parent_tags: dict[str, str] | None = None, parent_run_id: str | None = None,
                 background_lock: HostLock | None = None, reopen: bool = False) -> None:
        """A new parent run for the study, or ``parent_run_id``'s: a worker joining a running study, or with
        ``reopen`` an invocation resumed (running again, and ended by :meth:`close`)."""
        self.uri = tracking_uri or default_tracking_uri()
        self.study = study
        client = ensure_store(self.uri)
        self.experiment_id = experiment_id(client, study, self.uri)
        self.client = RidingClient(client)  # from here on, a study's calls wait out a store away for a moment
        self.owns_parent = parent_run_id is None or reopen
        if reopen and parent_run_id is not None:
            self.client.update_run(parent_run_id, status="RUNNING")
        if parent_run_id is None:
            tags = {KIND_TAG: "study", "mlflow.runName": parent_name or study, **(parent_tags or {})}
            parent_run_id = self.client.create_run(self.experiment_id, tags=tags).info.run_id
        self.parent_run_id = parent_run_id
        self.writer = writer_name()
        self.client.set_tag(parent_run_id, self.writer, OPEN)
        self._sealed_all = True  # every segment this writer sealed is in MLflow ...
        self._unsealed: set[str] = set()  # ... and these trials it wrote as runs are in none yet
        self._segments = 0
        self._trial_runs: dict[str, str] = {}  # trial_id -> run_id of the trials written here
        self._background = BackgroundWriter(self._write, background_lock) if background_lock else None

    def write(self, record: Row) -> None:
        """A run nested under the study's parent run, or under its co-run's run (written before it)."""
        self._unsealed.add(str(record.get("trial_id")))
        if self._background:
            self._background.put(record)
        else:
            self._write(record)

    def flush(self) -> None:
        """Return when every record given to :meth:`write` is in MLflow."""
        if self._background:
            self._background.flush()

    @property
    def trial_runs(self) -> dict[str, str]:
        """trial_id -> run_id of the trials written here."""
        self.flush()
        return self._trial_runs

    def _write(self, record: Row) -> None:
        fault_point("before-mlflow-write")
        params, metrics, tags, features = _split(record)
        run_name = f"{record.get('workload', 'trial')}-{record.get('trial_id', '')[:8]}"
        parent = self._trial_runs.get(str(record.get("corun_id")), self.parent_run_id)
        tags.update({KIND_TAG: record.get("record_kind", "trial"), "mlflow.parentRunId": parent,
                     INVOCATION_TAG: self.parent_run_id, "mlflow.runName": run_name,
                     **({FEATURES_TAG: FEATURES_FILE} if features else {})})
        run_id = self.client.create_run(self.experiment_id, tags=tags).info.run_id
        self.client.log_batch(run_id, metrics=metrics, params=params)
        if features:
            self.client.log_text(run_id, json.dumps(features), FEATURES_FILE)
        self.client.set_terminated(run_id, "FINISHED" if is_ok(record) else "FAILED")
        self._trial_runs[str(record.get("trial_id"))] = run_id

    def seal(self, rows: list[Row]) -> None:
        """``rows`` (canonical records) as a segment of the parent run, after what is queued before them."""
        self.held_in_segments([str(r.get("trial_id")) for r in rows])
        if not rows:
            return
        self._segments += 1
        name = f"{os.getpid()}-{int(time.time() * 1000)}-{self._segments:05d}.parquet"
        path = study_dir("segments", self.study, self.uri) / self.parent_run_id / name
        self.call(lambda: self._upload(rows, path), f"segment {name}")

    def _upload(self, rows: list[Row], path: Path) -> None:
        try:
            fault_point("before-segment-upload")
            upload_segment(self.client, self.parent_run_id, write_segment(rows, path), len(rows))
        except Exception:
            self._sealed_all = False  # the runs keep the records: readers read this invocation run by run
            log.exception("could not seal %d records into %s", len(rows), path.name)
            return
        path.unlink()

    def held_in_segments(self, trial_ids: list[str]) -> None:
        """These trials, written here as runs, are in segments (sealed here, or by another writer)."""
        self._unsealed.difference_update(trial_ids)

    def mark_sealed(self, writers: list[str]) -> None:
        """Writers (``opbench.writer.*`` tags) whose records are all in segments now, after what is queued."""
        self.call(lambda: self.client.log_batch(self.parent_run_id, tags=_tags(dict.fromkeys(writers, SEALED))),
                  "the sealed writers")

    def call(self, write: Any, what: str = "a study's summary") -> None:
        """``write()`` after the writes queued before it: in the background writer's thread, or now."""
        if self._background:
            self._background.call(write, what)
        else:
            write()

    def written_trial_ids(self) -> set[str]:
        """``trial_id`` of every finished run under the parent run (a run a killed writer left RUNNING is not)."""
        self.flush()
        ids, token = set(), None
        while True:
            page = self.client.search_runs([self.experiment_id], max_results=5000, page_token=token,
                                           filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'")
            ids |= {run.data.tags["trial_id"] for run in page
                    if run.info.status != "RUNNING" and "trial_id" in run.data.tags}
            token = page.token
            if not token:
                return ids

    def log_parent(self, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
                   tags: dict[str, str] | None = None, step: int = 0) -> None:
        """Study-level params/metrics/tags (references, best result, verification) on the parent run,
        after the trials written before (metrics at ``step``: a history in MLflow's charts)."""
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        batch = {"metrics": [Metric(k, float(v), now, step) for k, v in (metrics or {}).items() if v == v],
                 "params": [Param(k, str(v)) for k, v in (params or {}).items()], "tags": _tags(tags or {})}
        self.call(lambda: self.client.log_batch(self.parent_run_id, **batch))

    def parent_metric(self, key: str) -> float | None:
        """The parent run's latest value of ``key`` (as written so far)."""
        self.flush()
        return self.client.get_run(self.parent_run_id).data.metrics.get(key)

    def log_artifact(self, path: Path | str, artifact_path: str | None = None, trial_id: str | None = None) -> None:
        """Attach a file to the study's parent run, or to the run of the trial ``trial_id``."""
        run_id = self.trial_runs[trial_id] if trial_id else self.parent_run_id
        self.client.log_artifact(run_id, str(path), artifact_path)

    def close(self, status: str = "FINISHED") -> None:
        """Write what is queued, say whether this writer's records are all in segments, end the parent run
        when this writer owns it."""
        if self._background:
            self._background.close()
        if self._sealed_all and not self._unsealed:
            self.client.set_tag(self.parent_run_id, self.writer, SEALED)
        if self.owns_parent:
            self.client.set_terminated(self.parent_run_id, status)


def _tags(tags: dict[str, Any]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in tags.items()]
