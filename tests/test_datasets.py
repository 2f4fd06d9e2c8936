"""Datasets at scale: sealed segments, streamed export, import that merges, stores written before segments."""
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mlflow
from opbench.engines.loop import template_check, valid_proposals
from opbench.engines.simple import RandomEngine
from opbench.hardware.cpu_shape import CpuShape, shaped_for, target_shape
from opbench.hardware.resources import Resources, host_facts
from opbench.hardware.targets import make_target
from opbench.measure.assembly import config_assembly_features
from opbench.measure.features import FEATURES_VERSION, config_nest, nest_features, static_features
from opbench.record import SCHEMA_VERSION, TrialRecord
from opbench.space import get_template
from opbench.testing.lan import MlflowServer
from opbench.tracking import Recorder, how_to_open, read_mlflow_records
from opbench.tracking.dataset import export_mlflow, load_records, write_dataset
from opbench.tracking.dataset.featurize import ASSEMBLY_COLUMNS, NEST_COLUMNS
from opbench.tracking.dataset.formats import read_rows
from opbench.tracking.dataset.importer import import_dataset
from opbench.tracking.dataset.sources import Filters, fetch, plan
from opbench.tracking.mlflow_store import MlflowWriter, _client
from opbench.tracking.segment_store import SEALED, segment_artifacts
from opbench.tracking.segments import canonical, read_segment, table_records, write_segment
from opbench.workloads import parse_workload

from .cli import run_cli


def _record(i: int, **extra) -> TrialRecord:
    """A record as a study makes one: knobs, features, memory, the latency list and a free-form tag."""
    workload = f"matmul:m={32 * (1 + i % 3)},n=64,k=64"
    return TrialRecord(workload=workload, task_key=workload, op="matmul", threads=1 + i % 2,
                       latency_ms=1.0 + i, latencies_ms=[1.0 + i, 1.5 + i], status="ok" if i % 5 else "run_error",
                       knobs={"i_split": 4 * (i % 4), "order": "SSRRS"}, features={"flops": 2.0 * i, "x": math.pi},
                       memory={"workspace": 1024.0 * i}, tags={"engine_trial": i, "reference": False, **extra})


def _ids(rows) -> list[str]:
    return sorted(str(r["trial_id"]) for r in rows)


def test_a_segment_holds_records_as_mlflow_gives_them_back(tmp_path):
    rows = [_record(i).to_row() for i in range(9)]
    rows[3]["knob.i_split"] = "auto"  # a knob of numbers and words in one segment
    rows[4]["knob.huge"] = 2**63  # past int64
    path = write_segment([canonical(r) for r in rows], tmp_path / "s.parquet")
    back = {r["trial_id"]: r for r in table_records(read_segment(path))}
    for row in rows:
        assert back[row["trial_id"]] == canonical(row)
    assert back[rows[0]["trial_id"]]["engine_trial"] == "0" and back[rows[0]["trial_id"]]["reference"] == "False"
    assert back[rows[1]["trial_id"]]["knob.i_split"] == 4 and back[rows[4]["trial_id"]]["knob.huge"] == 2**63
    assert pq.ParquetFile(path).num_row_groups == 3  # one per workload: readers filtering on it skip the others


def test_a_recorder_seals_segments_as_it_goes_and_export_reads_only_them(tracking_uri, tmp_path):
    with Recorder("s", tracking_uri) as recorder:
        recorder.segments.max_records = 4
        for i in range(10):
            recorder(_record(i))
    client = _client(tracking_uri)
    parent = client.get_run(recorder.mlflow.parent_run_id)
    assert len(segment_artifacts(client, parent.info.run_id)) == 3  # 4 + 4, and 2 at the end
    assert parent.data.tags[recorder.mlflow.writer] == SEALED
    assert len(parent.inputs.dataset_inputs) == 3  # the UI lists each segment beside the runs
    done = export_mlflow(tmp_path / "s.parquet", ["s"], tracking_uri, Filters(status=("ok",)))
    assert done.segments == 3 and done.read_run_by_run == 0 and done.rows == 8
    exported = read_rows(tmp_path / "s.parquet", None)
    from_runs = [r for r in read_mlflow_records(["s"], tracking_uri) if r["status"] == "ok"]
    assert sorted(exported, key=lambda r: r["trial_id"]) == sorted(from_runs, key=lambda r: r["trial_id"])
    assert {r["schema_version"] for r in exported} == {SCHEMA_VERSION}


def test_a_store_written_before_segments_still_exports(tracking_uri, tmp_path):
    """Runs, no segment, no writer tags: as every store was before segments."""
    writer = MlflowWriter("old", tracking_uri)
    old = [{k: v for k, v in _record(i).items() if k != "task_key"} | {"schema_version": 1} for i in range(6)]
    for row in old:
        writer.write(row)
    writer.close()
    assert writer.client.get_run(writer.parent_run_id).data.tags[writer.writer] == "open"  # runs, never sealed
    assert export_mlflow(tmp_path / "open.jsonl", ["old"], tracking_uri).read_run_by_run == 6
    writer.client.delete_tag(writer.parent_run_id, writer.writer)
    done = export_mlflow(tmp_path / "old.jsonl", ["old"], tracking_uri)
    assert done.segments == 0 and done.read_run_by_run == done.rows == 6
    back = read_rows(tmp_path / "old.jsonl", None)
    assert _ids(back) == _ids(old)
    assert {r["task_key"] for r in back} == {f"matmul:m={m},n=64,k=64" for m in (32, 64, 96)}  # schema 1 rows get one


def test_records_no_segment_holds_export_from_their_runs(tracking_uri, tmp_path):
    """An invocation killed before it sealed: its writer stays open, so its runs are read, each once."""
    with Recorder("k", tracking_uri) as recorder:
        recorder.segments.max_records = 3
        for i in range(5):
            recorder(_record(i))
        recorder.mlflow.flush()
        client = recorder.mlflow.client
        recorder.segments.take()  # the last two never reach a segment ...
        recorder.mlflow._sealed_all = False  # ... as when the process dies before its end
    assert len(segment_artifacts(client, recorder.mlflow.parent_run_id)) == 1
    done = export_mlflow(tmp_path / "k.parquet", ["k"], tracking_uri)
    assert done.rows == 5 and done.read_run_by_run == 2
    assert _ids(read_rows(tmp_path / "k.parquet", None)) == _ids(recorder.records)


def test_import_merges_and_keeps_provenance(tracking_uri, tmp_path):
    rows = [_record(i).to_row() for i in range(7)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    first = import_dataset(path, "merged", tracking_uri)
    again = import_dataset(path, "merged", tracking_uri)
    assert (first.added, again.added, again.skipped) == (7, 0, 7)
    frame = load_records("mlflow", ["merged"], tracking_uri=tracking_uri, status=["ok", "run_error"])
    assert len(frame) == 7 and set(frame["study"]) == {"merged"} and frame["imported_from"].str.endswith("d.jsonl").all()
    client = _client(tracking_uri)
    kinds = {r.data.tags["opbench.kind"] for r in client.search_runs([client.get_experiment_by_name("merged").experiment_id])}
    assert kinds == {"import"}  # no per-trial runs unless asked, and no invocation --resume or verify would take


@pytest.mark.slow
def test_export_of_100000_records_keeps_memory_bounded(tracking_uri, tmp_path):
    """196 segments of a synthetic 100,000-record store (local folder), exported: one segment in memory at a time."""
    writer = MlflowWriter("big", tracking_uri)
    features = [f"feat.f{i:03d}" for i in range(150)]
    rng = np.random.default_rng(0)
    full = 0
    for n, start in enumerate(range(0, 100_000, 512)):
        size = min(512, 100_000 - start)
        table = pa.table({"workload": [f"w{(start + i) % 50}" for i in range(size)],
                          "trial_id": [f"{start + i:016x}" for i in range(size)], "status": ["ok"] * size,
                          "latency_ms": rng.random(size), **{f: rng.random(size) for f in features}})
        full += table.nbytes
        pq.write_table(table, tmp_path / f"{n}.parquet")
        writer.client.log_artifact(writer.parent_run_id, str(tmp_path / f"{n}.parquet"), "segments/host=h")
    writer.close()
    pool = pa.system_memory_pool()  # a pool of its own: its peak is this export's
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        done = export_mlflow(tmp_path / "big.parquet", ["big"], tracking_uri)
    finally:
        pa.set_memory_pool(previous)
    assert done.rows == 100_000 and done.read_run_by_run == 0
    assert pq.ParquetFile(tmp_path / "big.parquet").metadata.num_rows == 100_000
    assert full > 100 * 2**20 and pool.max_memory() < full / 10, (pool.max_memory(), full)


@pytest.mark.full  # starts an MLflow server
def test_import_then_export_through_an_mlflow_server_is_lossless_and_idempotent(tmp_path, monkeypatch):
    monkeypatch.setattr("opbench.tracking.dataset.importer.SEGMENT_RECORDS", 50)  # segments of 50: a run per record is slow
    server = MlflowServer(f"sqlite:///{tmp_path / 'server.db'}", "127.0.0.1", tmp_path / "artifacts")
    try:
        rows = [_record(i).to_row() for i in range(70)]  # two segments
        with tempfile.TemporaryDirectory() as scratch:
            source = write_segment([canonical(r) for r in rows], Path(scratch) / "source.parquet")
            first = import_dataset(source, "remote", server.uri, runs=True)
            again = import_dataset(source, "remote", server.uri)
        assert (first.added, again.added) == (70, 0)
        done = export_mlflow(tmp_path / "out.parquet", ["remote"], server.uri, Filters(status=("ok", "run_error")))
        assert done.segments == 2 and done.read_run_by_run == 0 and done.rows == 70
        out = read_rows(tmp_path / "out.parquet", None)
        provenance = ("source_study", "imported_from", "imported_at", "study")
        assert sorted([{k: v for k, v in r.items() if k not in provenance} for r in out], key=lambda r: r["trial_id"]) \
            == sorted([{k: v for k, v in canonical(r).items() if k != "study"} for r in rows], key=lambda r: r["trial_id"])
        runs = read_mlflow_records(["remote"], server.uri)  # --runs: a run per record, for the UI
        assert _ids(runs) == _ids(rows)
        experiment = mlflow.tracking.MlflowClient(server.uri).get_experiment_by_name("remote").experiment_id
        assert how_to_open("remote", server.uri) == f"open its runs: {server.uri}/#/experiments/{experiment}/runs"
        store = plan(["remote"], server.uri)
        with tempfile.TemporaryDirectory() as scratch:
            assert sum(t.num_rows for t in fetch(store, "trial", Path(scratch)).tables(Filters(status=("ok", "run_error"))))\
                == 70
    finally:
        server.stop()


def test_featurize_gives_older_records_the_features_a_record_made_on_their_cpu_carries(tmp_path):
    """A features-version-1 record gets the compute-nest features a record made today on its CPU carries: from
    this host, what the measurer logs; from a host of the other x86 vector width, its vectors; from a board, the board's. It and a
    version-2 record (which keeps its nest) get the assembly of their kernel built again for the x86 target
    they name, or this host's where they name none and ran on its vectors (none for a board's or another
    host's). Records that carry them, and invalid configs, keep what they have."""
    workload = parse_workload("matmul-512")
    template = get_template(workload)
    engine = RandomEngine(template.search_space(workload), 2, seed=3)
    configs = [p.config for p in valid_proposals(engine, template_check(workload, template), 4, max_rejects=100)]
    other = (({"feat.avx512": 0.0, "feat.avx2": 1.0}, CpuShape(256, 16)) if target_shape("llvm").vector_bits == 512
             else ({"feat.avx512": 1.0, "feat.avx2": 1.0}, CpuShape(512, 32)))
    hosts = {"this host": ({}, target_shape("llvm")), "a host of the other vector width": other,
             "rpi4": ({"target": json.dumps({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"})},
                      target_shape("rpi4"))}
    rows, expected = [], []
    for i, (config, (facts, shape)) in enumerate(zip(configs, [*hosts.values(), hosts["this host"]])):
        made = static_features(workload, config, template.name, Resources(2), host_facts())
        rows.append({"trial_id": f"t{i}", "workload": workload.name, "template": template.name, "threads": 2, "status": "ok",
                     "features_version": "1", **{f"knob.{k}": v for k, v in config.items()},
                     **{k: v for k, v in made.items() if k not in NEST_COLUMNS}, **facts})
        with shaped_for(shape):
            expected.append(nest_features(config_nest(config, workload, template.name), 2, shape))
    assert expected[0] == {k: v for k, v in static_features(workload, configs[0], template.name, Resources(2), host_facts()).items()
                           if k in NEST_COLUMNS}  # this host's: what the measurer logged
    rows[3].update(features_version=FEATURES_VERSION, **dict.fromkeys(NEST_COLUMNS, 7.0))  # carries them already
    rows.append({**rows[0], "trial_id": "v2", "features_version": "2", **dict.fromkeys(NEST_COLUMNS, 5.0)})
    rows.append({"trial_id": "bad", "workload": workload.name, "template": template.name, "threads": 2,
                 "status": "invalid_config", "features_version": "1"})
    rows.append({**rows[0], "trial_id": "gone", "workload": "matmul:m=512,n=512,k=512,layout=gone"})  # an older catalogue's
    write_dataset(pd.DataFrame(rows), tmp_path / "old.parquet")
    done = run_cli("dataset", "featurize", str(tmp_path / "old.parquet"), "--out", str(tmp_path / "new.parquet"), "--jobs", "2")
    assert done.returncode == 0 and "left as they were: the records of 'matmul:m=512,n=512,k=512,layout=gone'" in done.stdout
    assert "4 of 7 records given the features they lacked (features version 1 or 2 -> 3)" in done.stdout
    new = pd.read_parquet(tmp_path / "new.parquet").set_index("trial_id")
    assert pa.types.is_integer(pq.read_schema(tmp_path / "new.parquet").field("knob.k_inner").type)  # not "4.0" text
    for i, want in enumerate(expected[:3]):
        got = new.loc[f"t{i}", list(NEST_COLUMNS)].astype(float).to_dict()
        assert got == pytest.approx(want, nan_ok=True) and new.loc[f"t{i}", "features_version"] == FEATURES_VERSION
    assert expected[1] != pytest.approx(nest_features(config_nest(configs[1], workload, template.name), 2, target_shape("llvm")),
                                        nan_ok=True)
    assembly = config_assembly_features(workload, template, template.validate(configs[0], workload), make_target("llvm", 2))
    assert assembly["feat.asm_log_fp"] > 0 and set(assembly) == set(ASSEMBLY_COLUMNS)
    for built in ("t0", "v2"):
        assert new.loc[built, list(ASSEMBLY_COLUMNS)].astype(float).to_dict() == pytest.approx(assembly)
    assert (new.loc["v2", list(NEST_COLUMNS)] == 5.0).all() and new.loc["v2", "features_version"] == FEATURES_VERSION
    assert new.loc["t2", list(ASSEMBLY_COLUMNS)].isna().all()  # the board's kernel is not x86
    assert new.loc["t1", list(ASSEMBLY_COLUMNS)].isna().all()  # it names no target, and another host's vectors
    assert (new.loc["t3", list(NEST_COLUMNS)] == 7.0).all() and new.loc["t3", list(ASSEMBLY_COLUMNS)].isna().all()
    assert new.loc["bad", "features_version"] == "1" and new.loc["bad", list(NEST_COLUMNS)].isna().all()
    assert new.loc["gone", "features_version"] == "1" and new.loc["gone", list(NEST_COLUMNS)].isna().all()


ANSOR_LOG = Path(__file__).parent / "data" / "ansor_matmul_record.json"  # a public TenSet line (../shared/data)


def test_an_ansor_log_imports_as_catalogue_workloads_and_raw_tasks_with_their_latencies(tmp_path, tracking_uri):
    import json

    from opbench.tracking.dataset.importer import import_dataset

    line = json.loads(ANSOR_LOG.read_text())
    hashed = {**line, "i": [[json.dumps(["9e3bd222c4bd9bab1d4a9ac5c1ff3bd1", 1, 56, 56, 64]), *line["i"][0][1:]],
                            line["i"][1]], "r": [[1e-4, 3e-4], 0, 0.1, 1714270207]}
    failed = {**line, "r": [[1e10], 4, 0.1, 1714270208]}
    log = tmp_path / "task.json"
    log.write_text("".join(json.dumps(entry) + "\n" for entry in (line, hashed, failed)))
    assert import_dataset(log, "tenset", tracking_uri).added == 3
    assert import_dataset(log, "tenset", tracking_uri).added == 0  # its ids come from the lines: nothing twice
    frame = load_records("mlflow", ["tenset"], tracking_uri=tracking_uri).sort_values("finished_at")
    matmul, raw, bad = (TrialRecord.from_row(row.dropna().to_dict()) for _, row in frame.iterrows())
    assert (matmul.workload, matmul.task_key, matmul.threads) == ("matmul:m=512,n=64,k=1024", "matmul:m=512,n=64,k=1024", 16)
    assert matmul.latency_ms == pytest.approx(1.9849, abs=1e-4) and len(matmul.latencies_ms) == 10  # the line's median
    assert matmul.gflops == pytest.approx(2 * 512 * 64 * 1024 / 1.9849e-3 / 1e9, rel=1e-3)
    assert raw.workload.startswith("ansor:") and "9e3bd222c4bd9bab1d4a9ac5c1ff3bd1" in raw.task_key
    assert raw.latency_ms == pytest.approx(0.2) and raw.status == "ok"
    assert bad.status == "run_error" and "latency_ms" not in bad and "error number 4" in bad.error


def test_a_line_that_is_not_ansor_names_itself():
    from opbench.exceptions import OpBenchError
    from opbench.tracking.dataset.ansor_import import ansor_record

    with pytest.raises(OpBenchError, match="not an Ansor log line"):
        ansor_record('{"i": [], "r": []}', "s")
