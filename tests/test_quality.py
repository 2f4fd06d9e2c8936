"""Trustworthy numbers: isolated baselines, a quiet TVM pool, measurement quality, fresh-process verification."""
import contextlib
import math
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

import mlflow
from opbench import settings
from opbench.cli import main
from opbench.hardware.host_speed import SLOWNESS_COLUMNS
from opbench.hardware.resources import Resources
from opbench.measure import calibration, timing
from opbench.measure.calibration import Calibration
from opbench.measure.protocol import LibraryInput, RunInput, RunResult
from opbench.measure.runner.local import LocalRunner
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import TrialSpec
from opbench.measure.worker import LIBRARY, Worker
from opbench.record import Status, TrialRecord
from opbench.report.study_records import references
from opbench.space import get_template
from opbench.space.winograd import knobs as winograd_knobs
from opbench.studies.claims import speedup_table
from opbench.studies.verify import (
    BEST,
    CONTENDER,
    VERIFY_KIND,
    Spread,
    Verification,
    Verified,
    contenders_for,
    contenders_of,
    fastest_trials,
    remeasure,
    rounds_for,
    select_best,
    spec_of,
    verify,
    verify_runs,
)
from opbench.tracking import read_mlflow, read_mlflow_records
from opbench.workloads import parse_workload

MATMUL = "matmul:m=128,n=128,k=128"
REPORTED = ("best", "te_default", "template_default", "torch", "numpy")  # what a verification reports


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        return f.read()


def test_library_baselines_take_their_placements_in_fresh_processes_that_never_load_tvm(measurer):
    """(That a library worker never loads TVM: test_workers_refuse_work_of_the_other_role.)"""
    from opbench.workloads import parse_workload

    workload = parse_workload(MATMUL)
    kernel = measurer.measure(TrialSpec(workload, {}, Resources(2)))
    torch = measurer.measure_library(workload, "torch", Resources(2))
    numpy = measurer.measure_library(workload, "numpy", Resources(2))
    assert kernel["status"] == torch["status"] == numpy["status"] == "ok", (kernel["error"], torch["error"])
    assert torch["template"] == "torch" and torch["threads"] == 2
    for record in (kernel, torch, numpy):  # the same policy for kernels and baselines
        assert settings.placements() <= record["placements"] <= settings.max_placements()
        assert record["latency_lo_ms"] <= record["latency_ms"] <= record["latency_hi_ms"]
        assert record["repeat"] == record["placements"] * settings.REPEAT
    assert len({kernel["worker_pid"], torch["worker_pid"], numpy["worker_pid"]}) == 3
    assert all(not Path(f"/proc/{r['worker_pid']}").exists() for r in (torch, numpy))  # gone: nothing else ran there


@pytest.mark.full
def test_workers_refuse_work_of_the_other_role():
    library = Worker(threads=1, role=LIBRARY)
    try:
        result = library.call(RunInput("/nonexistent.so", "matmul:m=8,n=8,k=8"), timeout=120)
        assert result.status is Status.RUN_ERROR and "library worker does not take RunInput" in result.error
        ok = library.call(LibraryInput("matmul:m=8,n=8,k=8", "numpy"), timeout=120)
        assert ok.status is Status.OK and ok.pid == library.pid
        assert "libtvm" not in _maps(library.pid)
    finally:
        library.close()


def test_a_series_is_sized_by_a_warm_call_not_the_cold_first_one():
    calls = []

    def call():
        calls.append(1)
        time.sleep(0.002)

    number, repeat = TimingPolicy(repeat=5, min_repeat_ms=50).series_shape(0.049, call)
    assert len(calls) == 1 and 2 < number <= 25 and repeat == 5  # 2 ms a call or more, not the first's 49
    assert TimingPolicy(repeat=5, min_repeat_ms=50).series_shape(0.2, call) == (1, 5)  # past a repeat: as it is
    assert TimingPolicy(repeat=5, cache_flush=True).series_shape(0.001, call) == (1, 5)  # one call a repeat
    assert len(calls) == 1


def test_a_slow_kernels_series_takes_fewer_repeats():
    five = TimingPolicy(repeat=5)
    assert [five.repeats(s) for s in (0.05, 0.2, 0.25, 0.3, 5.0)] == [5, 5, 4, 3, 3]
    assert TimingPolicy(repeat=2).repeats(5.0) == 2  # never more than asked for


def test_the_tvm_pool_is_idle_once_a_timed_run_returns(measurer):
    """Before the timing lock is released nothing of the run spins: the child that timed it is gone and its
    worker never runs a kernel, so the next timed run, in whichever process, starts on quiet cores (TVM's
    default pool spun ~235 ms after a kernel)."""
    from opbench.workloads import parse_workload

    record = measurer.measure(TrialSpec(parse_workload(MATMUL), {}, Resources(2)))
    assert record["status"] == "ok", record["error"]
    timed_by = record["kernel_pid"]  # the process that ran the kernel: a child of the worker, reaped
    assert timed_by != record["worker_pid"]
    assert not Path(f"/proc/{timed_by}").exists()  # gone with its thread pool before the record came back
    # (the worker that forked it lives on: had the kernel run there, its pid would still be in /proc)


def test_every_record_has_its_interval_placements_and_the_hosts_load(measurer):
    from opbench.workloads import parse_workload

    workload = parse_workload("matmul:m=32,n=32,k=32")
    options = measurer.options
    saved = options.timing
    try:
        record = measurer.measure(TrialSpec(workload, {}, Resources(1)))
        baseline = measurer.measure_library(workload, "numpy", Resources(1))
        options.timing = replace(saved, cache_flush=True)  # one call a repeat, flushed
        flushed = measurer.measure(TrialSpec(workload, {}, Resources(1)))
    finally:
        options.timing = saved
    assert record["cache_state"] == "warm" and flushed["cache_state"] == "cold" and flushed["number"] == 1
    for r in (record, baseline, flushed):
        assert r["status"] == "ok", r["error"]
        assert 0.0 <= r["other_busy_frac"] <= 1.0 and r["load_1m"] >= 0.0
        assert set(SLOWNESS_COLUMNS) <= set(r)  # NaN: first 5 probes
        assert r["host_wait_s"] > 0 and r["placements"] >= settings.placements()  # probed before each placement
        assert r["latency_lo_ms"] <= r["latency_ms"] <= r["latency_hi_ms"]
        assert not {"remeasures", "spell_reruns", "turns", "turns_left_out"} & set(r)  # schema 2's, gone


@pytest.mark.full
def test_tune_verifies_its_claims_in_fresh_processes_and_verify_does_it_again(tmp_path, tracking_uri, capsys, monkeypatch):
    study = "v"
    monkeypatch.setattr(calibration, "CALIBRATION_FILE", "calibration-of-this-test.json")  # what this study adds alone
    common = ["--tracking-uri", tracking_uri, "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--repeat", "3"]
    assert main(["tune", MATMUL, "--engine", "random", "--trials", "3", "--threads", "2", "--seed", "0",
                 "--study", study, *common]) == 0  # verified in as many rounds as 3 trials get
    out = capsys.readouterr().out
    assert "verified x faster (min-max)" in out and "not verified" not in out

    client = mlflow.tracking.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(study)
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`opbench.kind` = 'study'")[0]
    metrics, tags = parent.data.metrics, parent.data.tags
    assert metrics["verify_rounds"] == rounds_for(3) == 2
    fresh = read_mlflow([study], tracking_uri, kind="verify")
    shared = "note_template_default" in tags  # the best is the default's schedule: timed once a round, as best
    timed = ["best", "te_default", "torch", "numpy", *(["template_default"] if not shared else [])]
    for name in REPORTED:  # the parent's spread is the rounds': the placements of its fresh-process record
        (record,) = fresh[fresh["verified_as"] == (name if name in timed else "best")].to_dict("records")
        rounds = record["placement_ms"]
        assert len(rounds) == record["placements"] and record["status"] == "ok"
        short = record["placements"] == 1 and record["repeat"] == timing.MIN_REPEATS  # 20x slower than the best
        assert record["placements"] == rounds_for(3) or short
        assert (metrics[f"verified_{name}_min_ms"], metrics[f"verified_{name}_ms"], metrics[f"verified_{name}_max_ms"]) \
            == pytest.approx((min(rounds), statistics.median(rounds), max(rounds)))
    for ref in ("te_default", "template_default", "torch", "numpy"):
        low, mid, high = (metrics[f"verified_speedup_vs_{ref}{s}"] for s in ("_min", "", "_max"))
        assert 0 < low <= mid <= high
        assert tags[f"claim_vs_{ref}"] in ("holds", "does not hold")

    trials = read_mlflow([study], tracking_uri)
    selection = fresh[fresh["verified_as"].str.startswith(CONTENDER)]  # the contenders, each over its placements
    ranked = [r["trial_id"] for r in contenders_of(read_mlflow_records([study], tracking_uri))]
    assert 1 <= len(ranked) <= 4  # the 3 fastest trials and the default (unless one of them), within 1.5x of the fastest
    chosen = len(ranked) > 1  # a lone contender is the best without a choice
    assert sorted(selection["verified_as"]) == [f"{CONTENDER}{n}" for n in range(1, len(ranked) + 1) if chosen]
    assert len(fresh) == len(timed) + len(selection) and set(fresh["status"]) == {"ok"}
    winner = int(selection.set_index("verified_as")["latency_ms"].idxmin().split("-")[1]) if chosen else 1
    assert tags["verified_best_trial"] == ranked[winner - 1]  # the lowest estimate in fresh processes is the best
    assert not set(fresh["worker_pid"]) & set(trials["worker_pid"])  # new processes, none of the study's workers
    recorded = references(read_mlflow_records([study], tracking_uri))  # no measurement chose them: they calibrate
    calibrated = {name: record["latency_ms"] / recorded[name]["latency_ms"] for name, record
                  in fresh.set_index("verified_as").iterrows() if name in recorded}
    (device,) = set(fresh["device_key"])
    assert sorted(Calibration().ratios(device)) == pytest.approx(sorted(calibrated.values()))
    assert len(calibrated) == len(timed) - 1  # every reference re-measured; neither the best nor a contender

    assert main(["verify", study, "--rounds", "1", "--repeat", "3", "--tracking-uri", tracking_uri]) == 0
    assert "verified x faster (min-max)" in capsys.readouterr().out
    again = len(ranked) * chosen  # verify chooses among the same contenders
    assert client.get_run(parent.info.run_id).data.metrics["verify_rounds"] == 1  # the latest verification
    later = read_mlflow([study], tracking_uri, kind="verify")
    later = later[later["finished_at"] > fresh["finished_at"].max()]
    names = sorted(n for n in later["verified_as"] if not n.startswith(CONTENDER))  # the default shares the best's
    assert names in (sorted(REPORTED), sorted(set(REPORTED) - {"template_default"}))
    assert len(later) == len(names) + again


def test_verification_rounds_and_contenders_grow_with_the_studys_budget():
    assert [rounds_for(t) for t in (1, 3, 32, 33, 48, 64, 65, 1000)] == [2, 2, 2, 3, 3, 4, 5, 5]
    assert [contenders_for(t) for t in (0, 3, 16, 17, 32, 33, 1000)] == [1, 1, 1, 2, 2, 3, 3]


def test_verify_needs_a_study_with_a_successful_trial(tracking_uri, capsys):
    assert main(["verify", "nope", "--tracking-uri", tracking_uri]) == 2
    assert "no MLflow experiment named 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "nope", "--rounds", "0", "--tracking-uri", tracking_uri])
    assert exit_.value.code == 2 and "argument --rounds: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(Exception, match="no successful trial"):
        fastest_trials([{"status": "invalid_config", "latency_ms": 1.0}])


def _verification(best_rounds, torch_rounds, tuned_best=1.0, tuned_torch=2.0):
    return Verification("s", len(best_rounds), {BEST: Verified(BEST, tuned_best, best_rounds),
                                                "torch": Verified("torch", tuned_torch, torch_rounds)})


def test_speedups_are_per_round_ratios_with_their_range():
    v = _verification([1.0, 1.1, 0.9], [2.0, 2.4, 1.8])
    up = v.speedup("torch")
    assert (up.lo, up.median, up.hi) == pytest.approx((2.0, 2.0, 2.1818), rel=1e-4)
    assert v.holds("torch")  # claimed 2.0 from the study, verified 2.0
    assert v.parent_tags() == {"claim_vs_torch": "holds"}
    assert v.parent_metrics()["verified_torch_min_ms"] == 1.8


def test_a_claim_that_does_not_survive_re_measurement_is_reported():
    v = _verification([1.0, 1.0, 1.0], [1.2, 1.25, 1.3], tuned_torch=12.0)  # the study claimed 12x, it is 1.25x
    assert v.holds("torch") is False
    table = speedup_table({"status": "ok", "latency_ms": 1.0}, {"torch": {"status": "ok", "latency_ms": 12.0}}, v)
    assert "DOES NOT HOLD" in table and "1.25 (1.2-1.3)" in table


def test_failed_rounds_leave_a_speedup_not_verified():
    v = _verification([math.nan, math.nan], [2.0, 2.0])
    assert v.speedup("torch") is None and v.holds("torch") is None
    assert v.speedup("onnxruntime") is None  # a reference that failed (a wrong result) was not re-measured
    assert v.parent_tags() == {"claim_vs_torch": "not verified"}
    table = speedup_table({"status": "ok", "latency_ms": 1.0}, {"torch": {"status": "ok", "latency_ms": 2.0}}, v)
    assert "not verified" in table and "holds" not in table
    assert "not verified" in speedup_table({"status": "ok", "latency_ms": 1.0},
                                           {"torch": {"status": "ok", "latency_ms": 2.0}}, None)


def test_a_build_that_is_anothers_is_timed_once_for_both_and_its_placements_are_its_rounds():
    best = RunResult(Status.OK, latencies_s=[1e-3, 1.2e-3, 2e-3, 2e-3, 3e-3, 3e-3], placement_sizes=[2, 2, 2])
    runs = {BEST: best, "torch": RunResult(Status.RUN_ERROR, "run: crashed"), "ort": "could not be exported"}
    v = verify_runs([BEST, "defaults", "torch", "ort"], runs, {BEST: 1.0, "defaults": 1.2}, "s", 3,
                    twins={"defaults": BEST})
    assert v.schedules[BEST].rounds_ms == pytest.approx([1.1, 2.0, 3.0])  # each placement's median, ms
    assert v.schedules["defaults"].rounds_ms == v.schedules[BEST].rounds_ms  # its rounds are the best's ...
    assert v.schedules["defaults"].rounds_ms is not v.schedules[BEST].rounds_ms  # ... copied
    assert v.schedules["defaults"].tuned_ms == 1.2 and list(v.schedules) == [BEST, "defaults", "torch", "ort"]
    assert v.ratio("defaults", BEST).median == 1.0 and "timed as best" in v.notes["defaults"]
    assert v.speedup("torch") is None and v.schedules["torch"].errors == ["run_error: run: crashed"]
    assert v.schedules["ort"].errors == ["could not be exported"]


def test_contenders_are_the_fastest_distinct_configs_and_references_the_latest_of_each_kind():
    records = [TrialRecord.from_row(r) for r in (
        {"status": "ok", "latency_ms": 3.0, "reference": "torch", "finished_at": 1.0},
        {"status": "ok", "latency_ms": 2.0, "knob.t": 2, "finished_at": 2.0},
        {"status": "ok", "latency_ms": 0.5, "knob.t": 5, "record_kind": "verify", "finished_at": 3.0},  # not a trial
        {"status": "wrong_result", "latency_ms": 0.1, "knob.t": 6, "finished_at": 4.0},
        {"status": "ok", "latency_ms": 1.5, "knob.t": 1, "finished_at": 5.0},
        {"status": "ok", "latency_ms": 1.6, "knob.t": 1, "finished_at": 5.5},  # the same config again
        {"status": "ok", "latency_ms": 2.5, "reference": "torch", "finished_at": 6.0},
        {"status": "ok", "latency_ms": 2.2, "knob.t": 3, "finished_at": 7.0},
    )]
    assert [r["latency_ms"] for r in fastest_trials(records, 3)] == [1.5, 2.0, 2.2]
    assert [r["latency_ms"] for r in fastest_trials(records, 1)] == [1.5]
    chosen = references(records)
    assert list(chosen) == ["torch"] and chosen["torch"]["latency_ms"] == 2.5



def test_the_template_default_contends_as_its_fastest_trial_or_as_its_reference():
    default = TrialRecord(latency_ms=1.4, knobs={"t": 9}, finished_at=1.0, tags={"reference": "template_default"})
    trials = [TrialRecord(latency_ms=ms, knobs={"t": t}, finished_at=2.0) for t, ms in ((1, 1.0), (2, 1.1))]
    assert contenders_of([default, *trials], 2) == [*trials, default]  # no trial has the default's config: its reference
    assert contenders_of([default, *trials], 1) == [trials[0], default]
    of_default = [TrialRecord(latency_ms=ms, knobs={"t": 9}, finished_at=3.0) for ms in (1.45, 1.3)]
    assert contenders_of([default, *trials, *of_default], 1) == [trials[0], of_default[1]]  # the default's fastest trial
    assert contenders_of([default, *trials, *of_default], 3) == [*trials, of_default[1]]  # among the fastest already
    assert contenders_of(trials, 1) == trials[:1]  # no template_default reference: nothing to add
    far = [trials[0].replace(latency_ms=3.0, **{"knob.t": 7})]  # tuned 3x slower than the fastest: cannot win
    assert contenders_of([default.replace(latency_ms=4.0), *trials, *far], 3) == trials
    fast_default = default.replace(latency_ms=0.5)
    assert contenders_of([fast_default, *trials], 2) == [fast_default]

def test_contenders_differ_in_their_schedules_not_in_knobs_their_algorithm_ignores():
    w = parse_workload("resnet50-c2")
    template = get_template(w)

    def trial(latency_ms, **knobs):
        config = template.validate(knobs, w)
        return TrialRecord(latency_ms=latency_ms, workload=w.name, template=template.name, knobs=config)

    winograd = {"algorithm": "winograd", "winograd_tile": 4}
    records = [trial(1.0, **winograd, ow_block=14), trial(1.1, **winograd, ow_block=7),  # one Winograd schedule
               trial(1.2, **{**winograd, "winograd_tile": 2}), trial(1.3, algorithm="direct", winograd_tile=2),
               trial(1.4, algorithm="direct", winograd_tile=4)]  # one direct schedule
    assert [r["latency_ms"] for r in fastest_trials(records, 3)] == [1.0, 1.2, 1.3]
    direct = template.parameters(template.validate({"algorithm": "direct"}, w), w)
    assert "ow_block" in direct and not any(k.startswith("winograd") for k in direct)
    own = {k.name for k in winograd_knobs(w)}  # (a catalogue conv has no winograd_in_op: its weight is transformed in the op)
    assert set(template.parameters(template.validate(winograd, w), w)) == {"algorithm", "layout_transform", *own}


class _FreshTimes:
    """A measurer whose fresh-process estimate of each matmul config is given by its ``k_inner`` (NaN: the run
    failed), the same in each of its placements."""

    def __init__(self, latencies):
        self.latencies, self.calls = latencies, 0
        self.calibration = Calibration(Path(tempfile.mkdtemp(prefix="opbench-calibration-")) / "calibration.json")

    def reusing_builds(self):
        return contextlib.nullcontext()

    def measure_fresh(self, specs, short=(), placements=None):
        self.calls += 1
        times = [self.latencies[spec.config["k_inner"]] for spec in specs]
        return [TrialRecord(latency_ms=t, status="ok" if t == t else "run_error", placement_ms=[t] * (placements or 3))
                for t in times]


def test_the_best_is_the_contender_fastest_in_fresh_processes():
    trials = [TrialRecord(latency_ms=ms, trial_id=f"t{ms}", workload=MATMUL, template="matmul", knobs={"k_inner": n})
              for n, ms in enumerate((1.0, 1.1, 1.2))]
    seen, fresh = [], _FreshTimes([1.3, 1.05, math.nan])
    assert select_best(fresh, trials, seen.append)["trial_id"] == "t1.1"  # the study's 1.0 was lucky
    assert fresh.calibration.ratios("") == []  # chosen for a low first measurement: their re-measures lean slow
    assert sorted(r["verified_as"] for r in seen) == [f"{CONTENDER}{n}" for n in (1, 2, 3)] and fresh.calls == 1
    assert all(r["record_kind"] == VERIFY_KIND for r in seen)
    assert select_best(_FreshTimes([0.9, math.nan, 1.0]), trials)["trial_id"] == "t1.0"  # a failed run never wins
    assert select_best(_FreshTimes([math.nan] * 3), trials)["trial_id"] == "t1.0"  # none ran: the study's fastest
    assert select_best(_FreshTimes([]), trials[:1])["trial_id"] == "t1.0"  # one contender: nothing to time


def test_a_reference_far_slower_than_the_best_takes_one_short_placement():
    class Spy(_FreshTimes):
        def measure_fresh(self, specs, short=(), placements=None):
            taken.append((sorted(specs[i].config["k_inner"] for i in short), placements))
            return super().measure_fresh(specs, short, placements)

    taken: list[list[int]] = []
    records = {name: TrialRecord(latency_ms=ms, workload=MATMUL, template="matmul", knobs={"k_inner": n})
               for n, (name, ms) in enumerate((("best", 1.0), ("near", 10.0), ("far", 300.0)))}
    spy = Spy([1.0, 11.0, 330.0])
    remeasure(spy, {n: spec_of(r) for n, r in records.items()}, {n: r["latency_ms"] for n, r in records.items()},
              rounds=2, unchosen={"near", "far"})
    assert taken == [([2], 2)]  # only the one past 20x the fastest; the others at least 2 placements (the rounds)
    assert spy.calibration.ratios("") == pytest.approx([1.1, 1.1])  # the references' fresh estimates, not the best's
    short = TimingPolicy().short()
    assert (short.repeat, short.placements, short.max_placements) == (timing.MIN_REPEATS, 1, 1)


def test_a_reference_that_runs_the_best_schedule_shares_its_processes():
    timed: list[list[str]] = []

    class Spy:
        reusing_builds = _FreshTimes.reusing_builds
        calibration = _FreshTimes([]).calibration

        def measure_fresh(self, specs, short=(), placements=None):
            timed.append(sorted(str(spec.template) for spec in specs))
            return [TrialRecord(latency_ms=2.0, status="ok", placement_ms=[2.0, 3.0] if spec.template == "mine" else [2.0] * 2)
                    for spec in specs]

    common = {"status": "ok", "threads": 1, "workload": MATMUL, "template": "mine", "finished_at": 1.0}
    default = {**common, "latency_ms": 1.0, "reference": "template_default", "trial_id": "d", "knob.k_inner": 0}
    records = [TrialRecord.from_row(r) for r in (
        default, {**common, "latency_ms": 3.0, "trial_id": "t", "knob.k_inner": 1},  # no contender
        {**common, "latency_ms": 2.0, "reference": "numpy", "template": "numpy"})]
    verification = verify(Spy(), records, "s", rounds=2)
    assert verification.best_trial == "d" and timed == [["mine", "numpy"]]  # the default once, as the best
    assert verification.schedules["template_default"].rounds_ms == verification.best.rounds_ms == [2.0, 3.0]
    assert verification.speedup("template_default") == Spread(1.0, 1.0, 1.0) and "template_default" in verification.notes
    verification.schedules["template_default"].rounds_ms.append(9.0)
    assert verification.best.rounds_ms == [2.0, 3.0]  # copies, not one list


def test_run_workers_get_a_short_pool_spin_unless_the_user_sets_one(monkeypatch):
    monkeypatch.delenv("TVM_THREAD_POOL_SPIN_COUNT", raising=False)
    assert Resources(2).worker_env()["TVM_THREAD_POOL_SPIN_COUNT"] == "10000"
    monkeypatch.setenv("TVM_THREAD_POOL_SPIN_COUNT", "0")
    assert Resources(2).worker_env()["TVM_THREAD_POOL_SPIN_COUNT"] == "0"


def test_threads_a_library_starts_after_pytorch_in_a_worker_may_use_every_core():
    """OpenVINO's and ONNX Runtime's pools inherit the cores of the thread that starts them: after PyTorch's
    OpenMP has loaded and run in a worker with the workers' environment, that thread still has every core it had."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to be pinned away from")
    script = ("import os; before = os.sched_getaffinity(0); import torch; torch.set_num_threads(2); "
              "torch.ones(256, 256) @ torch.ones(256, 256); print(os.sched_getaffinity(0) == before)")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **Resources(2).worker_env()},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_a_baseline_is_reused_only_while_young_and_the_host_reads_usual(measurer, monkeypatch, tmp_path):
    from opbench.measure.baselines import BaselineCache, baseline_key
    from opbench.workloads import parse_workload

    now, usual = [1000.0], [True]
    monkeypatch.setattr(measurer, "_baselines", BaselineCache(tmp_path / "baselines.json", clock=lambda: now[0]))
    monkeypatch.setattr(LocalRunner, "host_usual", lambda self, resources: usual[0])
    workload = parse_workload("matmul:m=16,n=16,k=16")

    def numpy(reuse_s=3600.0):
        record = measurer.measure_library(workload, "numpy", Resources(1), reuse_s=reuse_s)
        assert record["status"] == "ok", record["error"]
        return record

    first = numpy()
    assert "reused_from" not in first and (tmp_path / "baselines.json").stat().st_mode & 0o077 == 0
    now[0] += 600
    again = numpy()
    assert again["reused_from"] == first["trial_id"] and again["trial_id"] != first["trial_id"]
    assert again["latency_ms"] == first["latency_ms"] and again["baseline_age_s"] == 600
    usual[0] = False  # a probe finds the host in a spell: measured anew
    assert "reused_from" not in numpy()
    usual[0], now[0] = True, now[0] + 3601  # too old (the newest one was stored at 1600)
    assert "reused_from" not in numpy()
    assert "reused_from" not in numpy(reuse_s=0)  # never asked to reuse
    one, two = Resources(1), Resources(2)
    assert baseline_key(workload, "numpy", one, "h") != baseline_key(workload, "numpy", two, "h")
    assert baseline_key(workload, "numpy", one, "h") != baseline_key(workload, "torch", one, "h")
    assert "numpy==" in baseline_key(workload, "numpy", one, "h")  # its version: a new numpy measures anew


def test_a_study_stored_at_schema_2_reads_back_unchanged_and_verifies(measurer, tracking_uri, capsys):
    """A store written before the device key (schema 3) reads back without one, and `opbench verify` re-measures it."""
    from opbench.tracking import Recorder

    measured = measurer.measure(TrialSpec(parse_workload("matmul:m=32,n=32,k=32"), {}, Resources(1)))
    old = {k: v for k, v in measured.to_row().items() if k != "device_key"} | {"schema_version": 2, "engine_trial": "0"}
    with Recorder("schema2", tracking_uri) as recorder:
        recorder(TrialRecord.from_row(old))
    (back,) = read_mlflow_records(["schema2"], tracking_uri)
    assert back.schema_version == 2 and "device_key" not in back and back.trial_id == measured.trial_id
    assert {k: back[k] for k in ("workload", "template", "threads", "latency_ms")} == \
        {k: old[k] for k in ("workload", "template", "threads", "latency_ms")}
    assert main(["verify", "schema2", "--rounds", "1", "--tracking-uri", tracking_uri]) == 0
    fresh = read_mlflow_records(["schema2"], tracking_uri, kind=VERIFY_KIND)
    assert fresh and all(r.schema_version == 3 and r.device_key for r in fresh)  # re-measured here, as schema 3
