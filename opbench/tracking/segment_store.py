"""Segments in MLflow: artifacts of an invocation's parent run, registered as its dataset inputs, and
which of the invocation's writers have sealed everything they wrote (``opbench.writer.<host>-<pid>``
tags on the parent run: ``open`` while a writer runs, ``sealed`` once its last segment is in)."""
from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from opbench.tracking.segments import SEGMENTS_DIR, trial_ids

log = logging.getLogger("opbench")

WRITER_TAG = "opbench.writer."
INVOCATION_TAG = "opbench.invocation"  # on every trial run: the parent run of the invocation that wrote it
OPEN, SEALED = "open", "sealed"
DOWNLOADS = 8  # segments fetched at once from a tracking server


def writer_name(host: str | None = None, pid: int | None = None) -> str:
    return f"{WRITER_TAG}{host or socket.gethostname()}-{pid or os.getpid()}"


def upload_segment(client: Any, run_id: str, path: Path, rows: int) -> None:
    """``path`` as an artifact of the parent run ``run_id`` (``segments/host=<host>/``) and as its dataset input."""
    folder = f"{SEGMENTS_DIR}/host={socket.gethostname()}"
    client.log_artifact(run_id, str(path), folder)
    try:
        _log_dataset_input(client, run_id, path, f"{folder}/{path.name}", rows)
    except Exception as exc:  # noqa: BLE001 - the UI's view of the segment; the segment itself is in
        log.warning("segment %s: not registered as a dataset input of run %s: %s", path.name, run_id, exc)


def _log_dataset_input(client: Any, run_id: str, path: Path, artifact: str, rows: int) -> None:
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    source = f"{client.get_run(run_id).info.artifact_uri}/{artifact}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    dataset = MetaDataset(HTTPDatasetSource(source), name=path.stem, digest=digest)
    tags = [InputTag("mlflow.data.context", "segment"), InputTag("opbench.rows", str(rows))]
    client.log_inputs(run_id, [DatasetInput(dataset._to_mlflow_entity(), tags)])


def segment_artifacts(client: Any, run_id: str) -> list[str]:
    """The artifact paths of a parent run's segments (``segments/host=*/*.parquet``)."""
    paths = []
    for folder in client.list_artifacts(run_id, SEGMENTS_DIR):
        if folder.is_dir:
            paths += [f.path for f in client.list_artifacts(run_id, folder.path) if f.path.endswith(".parquet")]
    return sorted(paths)


def local_artifact(client: Any, run_id: str, artifact: str) -> Path | None:
    """Where an artifact lies when the run's artifact store is a local folder (None: fetch it)."""
    uri = urllib.parse.urlparse(client.get_run(run_id).info.artifact_uri)
    return Path(urllib.parse.unquote(uri.path)) / artifact if uri.scheme in ("", "file") else None


def fetch_segments(client: Any, wanted: list[tuple[str, str]], scratch: Path) -> list[Path]:
    """Local paths of segments (run id, artifact path): read in place from a local store, else downloaded,
    ``DOWNLOADS`` at once, into ``scratch``; in ``wanted``'s order."""
    roots: dict[str, Path | None] = {}
    for run_id, _ in wanted:
        if run_id not in roots:
            roots[run_id] = local_artifact(client, run_id, "")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    def fetch(item: tuple[int, tuple[str, str]]) -> Path:
        n, (run_id, artifact) = item
        root = roots[run_id]
        if root is not None:
            return root / artifact
        target = scratch / str(n)
        target.mkdir(parents=True, exist_ok=True)
        return Path(client.download_artifacts(run_id, artifact, str(target)))

    with concurrent.futures.ThreadPoolExecutor(DOWNLOADS) as pool:
        return list(pool.map(fetch, enumerate(wanted)))


def sealed_trial_ids(client: Any, run_id: str, scratch: Path) -> set[str]:
    """The trial ids a parent run's segments hold."""
    return trial_ids(fetch_segments(client, [(run_id, a) for a in segment_artifacts(client, run_id)], scratch))


def writers(tags: dict[str, str]) -> dict[str, str]:
    """A parent run's writers and whether each sealed what it wrote."""
    return {k: v for k, v in tags.items() if k.startswith(WRITER_TAG)}


def all_sealed(tags: dict[str, str]) -> bool:
    """Every record of the invocation is in a segment: it has writers, and each sealed its records."""
    known = writers(tags)
    return bool(known) and all(v == SEALED for v in known.values())
