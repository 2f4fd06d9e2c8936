"""``opbench dataset import``: records from a Parquet or JSON-lines dataset, a MetaSchedule database or an Ansor
(TenSet) log, into
a study of any store, as segments of an import run (per-trial runs only when asked), one segment's worth
in memory at a time. A record whose trial id the study holds is skipped, so importing twice adds nothing;
each keeps where it came from."""
from __future__ import annotations

import concurrent.futures
import datetime
import itertools
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opbench.exceptions import OpBenchError
from opbench.paths import default_tracking_uri
from opbench.tracking.dataset.ansor_import import ansor_rows, is_ansor_log
from opbench.tracking.dataset.formats import iter_rows
from opbench.tracking.dataset.sources import held_trial_ids, plan
from opbench.tracking.mlflow_store import KIND_TAG, MlflowWriter, ensure_store, experiment_id
from opbench.tracking.row import Row
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


def source_batches(path: Path, study: str) -> Iterator[list[Row]]:
    """The records of a dataset file, a MetaSchedule database folder or an Ansor log, a segment's worth at a time."""
    if path.is_dir():
        from opbench.tracking.dataset.metaschedule_import import import_metaschedule

        rows = [canonical(r) for r in import_metaschedule(path, study)]
        return iter([rows[i:i + SEGMENT_RECORDS] for i in range(0, len(rows), SEGMENT_RECORDS)])
    if not path.is_file():
        raise OpBenchError(f"nothing to import at {path}: give a .parquet or .jsonl dataset, an Ansor .json log or "
                           "a MetaSchedule database folder")
    if path.suffix == ".json" and is_ansor_log(path):
        lines = (canonical(r) for r in ansor_rows(path, study))
        batches = iter(lambda: list(itertools.islice(lines, SEGMENT_RECORDS)), [])
    else:
        batches = iter_rows(path, SEGMENT_RECORDS)
    first = next(batches, [])  # a file that cannot be read fails here, before the study is touched
    return itertools.chain([first], batches)


def import_dataset(path: Path | str, study: str, tracking_uri: str | None = None, runs: bool = False) -> Imported:
    """Add the records of ``path`` the study lacks to it, with their provenance (``source_study``,
    ``imported_from``, ``imported_at``), a segment at a time; with ``runs``, each also as a trial run for
    the MLflow UI."""
    path = Path(path)
    uri = tracking_uri or default_tracking_uri()
    batches = source_batches(path, study)
    experiment_id(ensure_store(uri), study, uri)
    with tempfile.TemporaryDirectory(prefix="opbench-import-") as scratch:
        held = held_trial_ids(plan([study], uri), Path(scratch))
    stamp = {"imported_from": f"{socket.gethostname()}:{path.resolve()}", "study": study,
             "imported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    writer = MlflowWriter(study, uri, parent_name=f"import {path.name}",
                          parent_tags={KIND_TAG: IMPORT_KIND, "opbench.import.source": stamp["imported_from"]})
    read = added = 0
    try:
        with concurrent.futures.ThreadPoolExecutor(RUN_WRITERS) as pool:
            for batch in batches:
                read += len(batch)
                new = [{**row, "source_study": row.get("source_study", row.get("study", "")), **stamp}
                       for row in _new(batch, held)]
                writer.seal(new)
                added += len(new)
                if runs:
                    list(pool.map(writer.write, new))
    except BaseException:
        writer.close("FAILED")
        raise
    writer.close()
    return Imported(read, added, writer.parent_run_id)


def _new(rows: list[Row], held: set[str]) -> list[Row]:
    """The rows whose trial id is not in ``held`` (which takes them in), each once, in order."""
    out = []
    for row in rows:
        if "trial_id" not in row:
            raise OpBenchError(f"a record without a trial_id cannot be imported: {sorted(row)[:8]}...")
        if str(row["trial_id"]) not in held:
            held.add(str(row["trial_id"]))
            out.append(row)
    return out
