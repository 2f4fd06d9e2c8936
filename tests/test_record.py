"""The record type: one constructor, rows that round-trip, column lists derived from its fields."""
import pytest

from opbench.hardware.resources import Resources
from opbench.measure.types import TrialSpec
from opbench.record import METRICS, PARAMS, TAGS, TrialRecord, from_mlflow_value, kind_of
from opbench.workloads import parse_workload


def test_the_column_lists_are_the_record_types_fields_by_kind():
    assert {"workload", "threads", "cache_state"} <= set(PARAMS) and {"latency_ms", "host_wait_s"} <= set(METRICS)
    assert {"status", "trial_id", "reused_from"} <= set(TAGS)
    assert len({*PARAMS, *METRICS, *TAGS}) == len(PARAMS) + len(METRICS) + len(TAGS)  # each column in one place
    assert [kind_of(c) for c in ("workload", "knob.k", "latency_ms", "feat.x", "status", "engine_trial")] == \
        ["param", "param", "metric", "feature", "tag", "tag"]


def test_a_row_round_trips_and_unknown_columns_are_kept_as_tags():
    record = TrialRecord(workload="matmul-8", op="matmul", threads=2, latency_ms=1.5, knobs={"vectorize": 1},
                         features={"flops": 1024.0})
    record.set(engine_trial="3", study="s", latencies_ms=[1.4, 1.5])
    row = record.to_row()
    assert row["knob.vectorize"] == 1 and row["feat.flops"] == 1024.0 and row["engine_trial"] == "3"
    assert record.study == "s" and "study" not in record.tags  # a known column is a field, not a loose tag
    assert None not in row.values() and "energy_j" not in row  # unset columns are left out
    assert TrialRecord.from_row(row) == record and TrialRecord.from_row(row).to_row() == row
    assert TrialRecord().trial_id != TrialRecord().trial_id


def test_a_record_reads_as_its_row_and_changes_only_through_set():
    record = TrialRecord(workload="w", latency_ms=2.0, knobs={"tile": 4}, features={"flops": 8.0}, memory={"workspace": 64.0})
    record.set(reference="torch")
    row = record.to_row()
    assert dict(record) == row and len(record) == len(row) and set(record) == set(row)
    assert record["latency_ms"] == 2.0 and record["knob.tile"] == 4 and record["feat.flops"] == 8.0
    assert record["mem.workspace"] == 64.0 and record["reference"] == "torch" and record.get("energy_j") is None
    assert "gflops" not in record and "knob.tile" in record and "knob.other" not in record  # unset: not in the row
    with pytest.raises(KeyError):
        record["gflops"]
    with pytest.raises(TypeError):
        record["latency_ms"] = 1.0  # type: ignore[index]
    assert record == row and record == TrialRecord.from_row(row) and record != {**row, "latency_ms": 3.0}


def test_a_replaced_record_is_a_copy_that_shares_nothing():
    record = TrialRecord(workload="w", latency_ms=2.0, knobs={"tile": 4})
    copy = record.replace(latency_ms=1.0, approach="independent", **{"knob.tile": 8, "feat.flops": 2.0})
    assert (copy.latency_ms, copy["approach"], copy.knobs, copy.features) == (1.0, "independent", {"tile": 8}, {"flops": 2.0})
    assert record == {**record.to_row()} and record["knob.tile"] == 4 and "approach" not in record


def test_stored_integers_come_back_as_the_fields_types():
    assert [from_mlflow_value(k, "3") for k in ("threads", "kernel_pid", "placements", "latency_ms", "study")] == \
        [3, 3, 3, 3.0, "3"]


def test_a_measured_record_is_the_record_type(measurer):
    record = measurer.measure(TrialSpec(parse_workload("matmul:m=8,n=8,k=8"), {}, Resources(1), tags={"engine_trial": "0"}))
    assert isinstance(record, TrialRecord) and record.status == "ok", record.error
    assert TrialRecord.from_row(record.to_row()) == record
    assert record["engine_trial"] == "0" and record.latencies_ms and record.worker_pid and record.worker_pid > 0
    from opbench.hardware.resources import host_facts

    assert record.device_key == host_facts().device_key and record.schema_version == 3


def test_a_row_of_an_older_schema_reads_back_unchanged():
    row = {"workload": "w", "status": "ok", "latency_ms": 1.0, "schema_version": 1, "trial_id": "t", "knob.a": 1}
    record = TrialRecord.from_row(row)
    assert record.to_row() == row and "task_key" not in record and record.task_key == ""  # typed, but not in its row
    record.set(task_key="matmul:m=1,n=1,k=1")
    assert record.to_row() == {**row, "task_key": "matmul:m=1,n=1,k=1"}  # set: now a column of its row


ZEN3 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
ZEN4 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
GRAVITON = "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\nCPU revision\t: 1\n"


def test_two_cpus_that_share_a_model_name_have_different_device_keys():
    from dataclasses import replace

    from opbench.hardware.resources import cpu_identity, host_facts

    assert (cpu_identity(ZEN3), cpu_identity(ZEN4)) == ("AuthenticAMD/25.1.1", "AuthenticAMD/25.17.1")
    assert cpu_identity(GRAVITON) == "arm/0x41.0xd40.0x1.1" and cpu_identity("") == ""
    here = host_facts()
    zen3, zen4 = replace(here, cpu_id=cpu_identity(ZEN3)), replace(here, cpu_id=cpu_identity(ZEN4))
    assert zen3.cpu_model == zen4.cpu_model and zen3.device_key != zen4.device_key
    assert zen3.device_key != replace(zen3, isa=zen3.isa[:-1]).device_key  # an ISA flag hidden (a VM): another device
    assert zen3.device_key != replace(zen3, l2_kb=zen3.l2_kb * 2).device_key != replace(zen3, cores=64).device_key
    assert zen3.device_key == replace(zen3, hostname="elsewhere", mhz=1.0).device_key  # the same device elsewhere
