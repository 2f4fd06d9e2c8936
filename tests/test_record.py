"""The record type: one constructor, rows that round-trip, column lists derived from its fields."""
from opbench.hardware.resources import Resources
from opbench.measure.types import TrialSpec
from opbench.record import METRICS, PARAMS, TAGS, TrialRecord, kind_of
from opbench.workloads import parse_workload


def test_the_column_lists_are_the_record_types_fields_by_kind():
    assert {"workload", "threads", "cache_flush"} <= set(PARAMS) and {"latency_ms", "host_wait_s"} <= set(METRICS)
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


def test_a_measured_record_is_a_row_of_the_record_type(measurer):
    row = measurer.measure(TrialSpec(parse_workload("matmul:m=8,n=8,k=8"), {}, Resources(1), tags={"engine_trial": "0"}))
    assert row["status"] == "ok", row["error"]
    assert TrialRecord.from_row(row).to_row() == row
    assert row["engine_trial"] == "0" and row["latencies_ms"] and row["worker_pid"] > 0
