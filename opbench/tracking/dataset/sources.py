"""Where the records of some studies are in an MLflow store: the sealed segments of each invocation, and,
read run by run, only what no segment holds (an invocation in flight or killed before it sealed, a store
written before segments). :func:`fetch` gathers them; :meth:`Fetched.tables` yields them filtered, in one schema."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opbench.tracking.mlflow_read import experiment_ids, runs_records
from opbench.tracking.mlflow_store import KIND_TAG, _client
from opbench.tracking.row import Row, column_order
from opbench.tracking.segment_store import INVOCATION_TAG, all_sealed, fetch_segments, segment_artifacts, writers
from opbench.tracking.segments import to_table, trial_ids
from opbench.workloads import task_key_of

PARENT_KINDS = ("study", "import", "report")  # runs that gather an invocation's records
CHUNK = 5000  # records read run by run go out in tables of this many


@dataclass(frozen=True)
class Filters:
    """Which records to keep: any status, op or host when a tuple is empty; ``kind`` trial or corun."""

    status: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    kind: str = "trial"

    def expression(self, columns: list[str]) -> Any:
        """The filter as an Arrow expression over a table or file with ``columns`` (one that lacks a column
        filtered on keeps none of its rows, but for ``record_kind``: absent means trial)."""
        import pyarrow.compute as pc

        kind = pc.field("record_kind") if "record_kind" in columns else pc.scalar(None).cast("string")
        keep = pc.equal(pc.if_else(pc.is_null(kind), "trial", kind), self.kind)
        for name, wanted in (("status", self.status), ("op", self.ops), ("host", self.hosts)):
            if wanted:
                keep = keep & (pc.field(name).isin(list(wanted)) if name in columns else pc.scalar(False))
        return keep

    def apply(self, table: Any) -> Any:
        """The table's rows that pass."""
        return table.filter(self.expression(table.column_names))

    def read(self, path: Path) -> Any:
        """A segment's rows that pass, the filter pushed down to the Parquet reader."""
        import pyarrow.parquet as pq

        return pq.read_table(path, filters=self.expression(pq.read_schema(path).names))


@dataclass
class StorePlan:
    """What to read for some experiments of a store."""

    client: Any
    experiment_ids: list[str]
    segments: list[tuple[str, str]] = field(default_factory=list)  # (parent run id, artifact path)
    unsealed: list[str] = field(default_factory=list)  # parent runs whose segments may miss records
    legacy: list[str] = field(default_factory=list)  # experiments with a parent run older than segments


def plan(experiments: list[str], uri: str) -> StorePlan:
    """The segments of every invocation of ``experiments``, and what must be read run by run."""
    client = _client(uri)
    result = StorePlan(client, experiment_ids(client, experiments, uri))
    for exp in result.experiment_ids:
        for kind in PARENT_KINDS:
            for parent in client.search_runs([exp], filter_string=f"tags.`{KIND_TAG}` = '{kind}'", max_results=50000):
                tags = parent.data.tags
                result.segments += [(parent.info.run_id, a) for a in segment_artifacts(client, parent.info.run_id)]
                if not writers(tags):
                    result.legacy.append(exp)
                elif not all_sealed(tags):
                    result.unsealed.append(parent.info.run_id)
    result.legacy = sorted(set(result.legacy))
    return result


@dataclass
class Fetched:
    """The records of a plan at hand: segment files (read in place or downloaded) and, as Arrow tables,
    the records read run by run that no segment holds."""

    segments: list[Path]
    runs: list[Any]

    def schema(self) -> Any:
        """One schema for every table (:func:`merged_schema`), read from the segments' footers; with a task
        key, which :func:`with_task_keys` gives the rows that lack one."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = pa.schema([("task_key", pa.string())])
        return merged_schema([pq.read_schema(p) for p in self.segments] + [t.schema for t in self.runs] + [keys])

    def tables(self, filters: Filters) -> Iterator[Any]:
        """Each segment, then the records read run by run, filtered: one segment in memory at a time."""
        for path in self.segments:
            yield with_task_keys(filters.read(path))
        for table in self.runs:
            yield with_task_keys(filters.apply(table))


def fetch(store: StorePlan, kind: str, scratch: Path) -> Fetched:
    """The plan's segments (downloaded into ``scratch`` from a remote store, several at once) and the
    records of kind ``kind`` that must be read run by run because no segment holds them."""
    paths = fetch_segments(store.client, store.segments, scratch)
    held = trial_ids(paths)
    runs, chunk = [], []
    for record in _unsealed_records(store, kind, held):
        chunk.append(record)
        if len(chunk) == CHUNK:
            runs.append(to_table(chunk))
            chunk = []
    return Fetched(paths, runs + ([to_table(chunk)] if chunk else []))


def held_trial_ids(store: StorePlan, scratch: Path) -> set[str]:
    """The trial ids of every record of the plan, of any kind (segments' and, by their tags, runs')."""
    paths = fetch_segments(store.client, store.segments, scratch)
    held = trial_ids(paths)
    queries = [(store.experiment_ids, f"tags.`{INVOCATION_TAG}` = '{parent}'") for parent in store.unsealed]
    queries += [(store.legacy, "")] if store.legacy else []
    for experiments, text in queries:
        token = None
        while True:
            page = store.client.search_runs(experiments, filter_string=text, max_results=5000, page_token=token)
            held.update(run.data.tags["trial_id"] for run in page if "trial_id" in run.data.tags)
            token = page.token
            if not token:
                break
    return held


def _unsealed_records(store: StorePlan, kind: str, held: set[str]) -> Iterator[Row]:
    """Records no segment holds, each once (``held`` grows with them)."""
    query = f"tags.`{KIND_TAG}` = '{kind}'"
    queries = [(store.experiment_ids, f"{query} and tags.`{INVOCATION_TAG}` = '{parent}'") for parent in store.unsealed]
    queries += [(store.legacy, query)] if store.legacy else []
    for experiments, text in queries:
        for record in runs_records(store.client, experiments, text, held):
            if str(record.get("trial_id")) not in held:
                held.add(str(record.get("trial_id")))
                yield record


def with_task_keys(table: Any) -> Any:
    """``table`` with a ``task_key`` on every row: records made before they carried one (schema 1) get it
    from their workload where it still parses."""
    import pyarrow as pa

    if "workload" not in table.column_names:
        return table
    keys = table.column("task_key").to_pylist() if "task_key" in table.column_names else [None] * len(table)
    if all(keys):
        return table
    filled = pa.array([k or task_key_of(str(w)) for k, w in zip(keys, table.column("workload").to_pylist())], pa.string())
    if "task_key" in table.column_names:
        return table.set_column(table.column_names.index("task_key"), "task_key", filled)
    return table.append_column("task_key", filled)


def merged_schema(schemas: list[Any]) -> Any:
    """The union of ``schemas`` in the dataset's column order; a column typed differently in two of them
    becomes float64 where both are numbers, else string."""
    import pyarrow as pa

    types: dict[str, set[Any]] = {}
    for schema in schemas:
        for f in schema:  # a list's item is named "element" once it went through Parquet: one list type
            types.setdefault(f.name, set()).add(pa.list_(f.type.value_type) if pa.types.is_list(f.type) else f.type)
    fields = []
    for name in column_order(list(types)):
        seen = {t for t in types[name] if t != pa.null()} or {pa.string()}
        if len(seen) > 1:
            seen = {pa.float64()} if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in seen) else {pa.string()}
        fields.append(pa.field(name, seen.pop()))
    return pa.schema(fields)


def conform(table: Any, schema: Any) -> Any:
    """``table`` with ``schema``'s columns in its order: absent ones null, others cast."""
    import pyarrow as pa

    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)
