"""``opbench dataset import``: records from a Parquet or JSON-lines dataset, or a MetaSchedule database, into
a study of any store, as segments of an import run (per-trial runs only when asked). A record whose trial
id the study holds is skipped, so importing twice adds nothing; each keeps where it came from."""
from __future__ import annotations

import concurrent.futures
import datetime
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opbench.exceptions import OpBenchError
from opbench.paths import default_tracking_uri
from opbench.record import Record
from opbench.tracking.dataset.formats import read_rows
from opbench.tracking.dataset.sources import held_trial_ids, plan
from opbench.tracking.mlflow_store import KIND_TAG, MlflowWriter, ensure_store, experiment_id
from opbench.tracking.segments import SEGMENT_RECORDS, canonical

IMPORT_KIND = "import"  # the parent run of an import: never an invocation that --resume or verify takes
RUN_WRITERS = 8  # per-trial runs written at once with --runs


@dataclass
class Imported:
    read: int
    added: int
    parent_run_id: str

    @property
    def skipped(self) -> int:
        return self.read - self.added


def source_rows(path: Path, study: str) -> list[Record]:
    """The records of a dataset file or a MetaSchedule database folder."""
    if path.is_dir():
        from opbench.tracking.dataset.metaschedule_import import import_metaschedule

        return [canonical(r) for r in import_metaschedule(path, study)]
    if not path.is_file():
        raise OpBenchError(f"nothing to import at {path}: give a .parquet or .jsonl dataset or a MetaSchedule database folder")
    return read_rows(path, None)


def import_dataset(path: Path | str, study: str, tracking_uri: str | None = None, runs: bool = False) -> Imported:
    """Add the records of ``path`` the study lacks to it, with their provenance (``source_study``,
    ``imported_from``, ``imported_at``); with ``runs``, each also as a trial run for the MLflow UI."""
    path = Path(path)
    uri = tracking_uri or default_tracking_uri()
    rows = source_rows(path, study)
    experiment_id(ensure_store(uri), study, uri)
    with tempfile.TemporaryDirectory(prefix="opbench-import-") as scratch:
        held = held_trial_ids(plan([study], uri), Path(scratch))
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    origin = f"{socket.gethostname()}:{path.resolve()}"
    new = [{**row, "source_study": row.get("source_study", row.get("study", "")), "imported_from": origin,
            "imported_at": now, "study": study} for row in _unique(rows) if str(row.get("trial_id")) not in held]
    writer = MlflowWriter(study, uri, parent_name=f"import {path.name}",
                          parent_tags={KIND_TAG: IMPORT_KIND, "opbench.import.source": origin})
    try:
        for start in range(0, len(new), SEGMENT_RECORDS):
            writer.seal(new[start:start + SEGMENT_RECORDS])
        if runs:
            with concurrent.futures.ThreadPoolExecutor(RUN_WRITERS) as pool:
                list(pool.map(writer.write, new))
    except BaseException:
        writer.close("FAILED")
        raise
    writer.close()
    return Imported(len(rows), len(new), writer.parent_run_id)


def _unique(rows: list[Record]) -> list[Record]:
    """Rows with a trial id seen once (the first of each), in order."""
    seen: set[str] = set()
    out = []
    for row in rows:
        if "trial_id" not in row:
            raise OpBenchError(f"a record without a trial_id cannot be imported: {sorted(row)[:8]}...")
        if str(row["trial_id"]) not in seen:
            seen.add(str(row["trial_id"]))
            out.append(row)
    return out
