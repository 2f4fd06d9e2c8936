"""Datasets at scale: 1,000, 10,000 and 100,000 records into and out of an MLflow store, in one run.

The records are copies (new trial ids) of real ones: a small matmul's random configs measured here, each
with its ~200 features. Stores: a local ``mlflow server`` in MLflow 3's default mode (sqlite behind it,
artifacts proxied by the server) and a local sqlite store; plain Parquet (pyarrow reading and writing the
same rows) is the floor. For each size: ``opbench dataset import`` of a Parquet file of the copies (no
per-trial runs) and ``opbench dataset export`` back, each a process of its own timed from its start
(wall clock including the CLI's start-up) with its peak RSS; and the storage time the trial loop spends per
record (a Recorder as ``opbench tune`` uses it: write-ahead log, MLflow and sealing in the background).
With ``--before SRC`` (a checkout of an older OpBench), the same export at 1,000 records by that code, its
records written as it wrote them (a run per record).

    .venv/bin/python benchmarks/dataset_scale.py [--sizes 1000,10000,100000] [--before /tmp/before]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from _results import Results

from opbench.engines.loop import run_tuning
from opbench.engines.registry import EngineSpec, create_engine
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.record import TrialRecord, new_trial_id
from opbench.report.progress import table
from opbench.space import get_template
from opbench.testing.lan import MlflowServer
from opbench.tracking import JsonlWriter, Recorder
from opbench.tracking.segments import canonical, write_segment
from opbench.workloads import parse_workload

TIME, MAXRSS = "/usr/bin/time", "opbench-maxrss-kb"  # GNU time (Debian's `time` package)
LOOP_RECORDS = 200  # records timed through the trial loop's storage path
BEFORE_RECORDS = 1_000
WRITE_RUNS = """
import sys
from opbench.tracking.jsonl import read_jsonl_records
from opbench.tracking.mlflow_store import MlflowWriter
writer = MlflowWriter(sys.argv[2], sys.argv[3])
for record in read_jsonl_records(sys.argv[1]):
    writer.write(record)
writer.close()
"""


def real_records(n: int) -> list[TrialRecord]:
    """``n`` random configs of a small matmul, measured here."""
    workload, resources = parse_workload("matmul:m=128,n=128,k=128"), Resources(2)
    template = get_template(workload)
    engine = create_engine(EngineSpec("random", seed=0), template.search_space(workload), workload, template,
                           resources, "dataset-scale")
    records: list[TrialRecord] = []
    with Measurer(MeasureOptions(TimingPolicy(repeat=3))) as measurer:
        run_tuning(engine, workload, n, measurer, records.append, resources, fresh=True)
    return records


def copies(records: list[TrialRecord], n: int) -> list[TrialRecord]:
    return [records[i % len(records)].replace(trial_id=new_trial_id()) for i in range(n)]


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, float]:
    """Run ``argv``; its wall time (s) and peak RSS (MB). It must succeed. The peak is GNU time's report of
    its own child: a process forked from this one would count this one's memory as its own."""
    start = time.perf_counter()
    out = subprocess.run([TIME, "-f", f"{MAXRSS} %M", *argv], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {out.stderr[-2000:]}")
    return wall, float(out.stderr.rsplit(MAXRSS, 1)[1].split()[0]) / 1024


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "opbench.cli", *args]


def loop_storage_ms(uri: str, records: list[TrialRecord], scratch: Path) -> tuple[float, float]:
    """Mean and p95 ms a Recorder's call takes in the trial loop (MLflow written in its background thread)."""
    times = []
    with Recorder(f"loop-{new_trial_id()}", uri, background_lock=HostLock(scratch / "lock")) as recorder:
        for record in records:
            start = time.perf_counter()
            recorder(record.replace())  # a copy: the recorder stamps its study on it
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.fmean(times), statistics.quantiles(times, n=20)[-1]


def parquet_floor(path: Path, scratch: Path) -> float:
    """Reading the rows and writing them again, nothing else: the floor of an export."""
    start = time.perf_counter()
    pq.write_table(pq.read_table(path), scratch / "floor.parquet")
    return time.perf_counter() - start


def measure_store(name: str, uri: str, sizes: list[int], base: list[TrialRecord], scratch: Path, out: Results) -> list[tuple]:
    rows = []
    loop_mean, loop_p95 = loop_storage_ms(uri, copies(base, LOOP_RECORDS), scratch)
    for n in sizes:
        source = write_segment([canonical(r) for r in copies(base, n)], scratch / f"records-{n}.parquet")
        study = f"{name}-{n}"
        import_s, _ = timed(cli("dataset", "import", str(source), "--study", study, "--tracking-uri", uri))
        export_s, rss = timed(cli("dataset", "export", "--experiment", study, "--tracking-uri", uri,
                                  "--out", str(scratch / f"{study}.parquet")))
        assert pq.ParquetFile(scratch / f"{study}.parquet").metadata.num_rows == n
        rows.append((name, n, import_s, export_s, rss, parquet_floor(source, scratch), loop_mean, loop_p95))
        out.print(f"{name} {n}: import {import_s:.1f} s, export {export_s:.1f} s ({rss:.0f} MB peak)")
    return rows


def before(src: Path, uri: str, name: str, base: list[TrialRecord], scratch: Path) -> tuple:
    """The older code's export of BEFORE_RECORDS records it wrote as it did (a run each)."""
    log = scratch / "before.jsonl"
    writer = JsonlWriter(log)
    for record in copies(base, BEFORE_RECORDS):
        writer.write(record)
    env = {**os.environ, "PYTHONPATH": str(src)}  # run from src: `-m` and `-c` put the working folder first
    study = f"before-{name}"
    write_s, _ = timed([sys.executable, "-c", WRITE_RUNS, str(log), study, uri], env, src)
    export_s, rss = timed(cli("dataset", "export", "--experiment", study, "--tracking-uri", uri,
                              "--out", str(scratch / f"{study}.parquet")), env, src)
    return (name, BEFORE_RECORDS, write_s, export_s, rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--before", type=Path, help="a checkout of older OpBench code to export 1,000 records with")
    args = parser.parse_args()
    if shutil.which(TIME) is None:
        raise SystemExit(f"{TIME} (GNU time) measures each command's peak memory: apt-get install time")
    sizes = [int(s) for s in args.sizes.split(",")]
    out = Results("dataset_scale")
    base = real_records(16)
    out.print(f"{len(base)} real records ({sum(k.startswith('feat.') for k in base[0])} features each), copied")
    with tempfile.TemporaryDirectory(prefix="opbench-dataset-scale-") as folder:
        scratch = Path(folder)
        server = MlflowServer(f"sqlite:///{scratch / 'server.db'}", "127.0.0.1", scratch / "server-artifacts")
        stores = {"mlflow server": server.uri, "sqlite": f"sqlite:///{scratch / 'local' / 'mlflow.db'}"}
        try:
            rows = [row for name, uri in stores.items() for row in measure_store(name, uri, sizes, base, scratch, out)]
            old = [before(args.before, uri, name, base, scratch) for name, uri in stores.items()] if args.before else []
        finally:
            server.stop()
    out.table(table([(s, n, i, e, r, f, m, p) for s, n, i, e, r, f, m, p in rows],
                    ["store", "records", "import s", "export s", "export peak RSS MB", "parquet floor s",
                     "loop ms/record (mean)", "loop p95 ms"]))
    if old:
        out.print(f"\nbefore: {args.before} (a run per record, exported run by run)")
        out.table(table(old, ["store", "records", "writing them s", "export s", "export peak RSS MB"]))
    out.print("")
    for line in verdicts(rows):
        out.print(line)
    out.save()


def verdicts(rows: list[tuple]) -> list[str]:
    """Each target, met or not, on every store (rows: store, records, import s, export s, RSS MB, floor, loop)."""
    checks = [("import 10,000 <= 60 s", lambda r: r[1] != 10_000 or r[2] <= 60),
              ("export 10,000 <= 10 s", lambda r: r[1] != 10_000 or r[3] <= 10),
              ("export 100,000 <= 60 s", lambda r: r[1] != 100_000 or r[3] <= 60),
              ("export peak RSS <= 2 GB", lambda r: r[4] <= 2048),
              ("the trial loop <= 20 ms a record on storage (mean)", lambda r: r[6] <= 20)]
    return [f"{'met' if all(check(r) for r in rows) else 'NOT MET'}: {name}" for name, check in checks]


if __name__ == "__main__":
    main()
