"""Dataset files: Parquet and JSON lines hold records losslessly (every column, the latency lists, the
features); CSV is a view (lists as JSON text, types as CSV readers guess them)."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.tracking.row import Row, json_line
from opbench.tracking.segments import canonical, table_records, to_table

FORMATS = (".parquet", ".jsonl", ".csv")
CSV_NOTE = "CSV is a view: lists are JSON text and types are what a CSV reader guesses; .parquet or .jsonl keep every value"


class _ParquetOut:
    def __init__(self, path: Path, schema: Any) -> None:
        import pyarrow.parquet as pq

        self._writer = pq.ParquetWriter(path, schema)

    def write(self, table: Any) -> None:
        if len(table):
            self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()


class _JsonlOut:
    def __init__(self, path: Path, schema: Any) -> None:
        self._file = open(path, "w", encoding="utf-8")

    def write(self, table: Any) -> None:
        for record in table_records(table):
            self._file.write(json_line(record) + "\n")

    def close(self) -> None:
        self._file.close()


class _CsvOut:
    def __init__(self, path: Path, schema: Any) -> None:
        import pyarrow as pa
        import pyarrow.csv as csv

        self._lists = [f.name for f in schema if pa.types.is_list(f.type)]
        self._schema = pa.schema([pa.field(f.name, pa.string()) if f.name in self._lists else f for f in schema])
        self._writer = csv.CSVWriter(str(path), self._schema)

    def write(self, table: Any) -> None:
        import pyarrow as pa

        for name in self._lists:
            text = pa.array([None if v is None else json.dumps(v) for v in table.column(name).to_pylist()], pa.string())
            table = table.set_column(table.schema.get_field_index(name), name, text)
        self._writer.write_table(table.cast(self._schema))

    def close(self) -> None:
        self._writer.close()


@contextlib.contextmanager
def open_writer(path: Path, schema: Any) -> Iterator[Any]:
    """A writer of tables with ``schema`` to ``path``, in the format its suffix names; the file is complete
    when the block ends (a partial file is removed on error)."""
    outs: dict[str, type[_ParquetOut | _JsonlOut | _CsvOut]] = {".parquet": _ParquetOut, ".jsonl": _JsonlOut,
                                                                 ".csv": _CsvOut}
    if path.suffix not in outs:
        raise OpBenchError(f"{path}: dataset files are {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = outs[path.suffix](path, schema)
    try:
        yield writer
    except BaseException:
        writer.close()
        path.unlink(missing_ok=True)
        raise
    writer.close()


def iter_rows(path: Path, batch: int) -> Iterator[list[Row]]:
    """The records of a Parquet or JSON-lines dataset ``batch`` at a time, as :func:`canonical` gives them."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            for part in pq.ParquetFile(path).iter_batches(batch_size=batch):
                yield table_records(pa.Table.from_batches([part]))
        except (OSError, ValueError) as exc:
            raise OpBenchError(f"{path}: not a readable parquet dataset ({str(exc).splitlines()[0][:200]})") from None
        return
    rows = read_rows(path, None)
    for start in range(0, len(rows), batch):
        yield rows[start:start + batch]


def read_rows(path: Path, filters: Any | None) -> list[Row]:
    """The records of a Parquet or JSON-lines dataset (or log), as :func:`canonical` gives them, filtered."""
    from opbench.tracking.jsonl import read_jsonl_rows

    if path.suffix == ".jsonl":
        rows = [canonical(r) for r in read_jsonl_rows(path)]
        return table_records(filters.apply(to_table(rows))) if filters is not None and rows else rows
    if path.suffix != ".parquet":
        raise OpBenchError(f"{path}: records are read from .parquet or .jsonl files")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise OpBenchError(f"{path}: not a readable parquet dataset ({str(exc).splitlines()[0][:200]})") from None
    return table_records(filters.apply(table) if filters is not None else table)
