"""Thread-scaling study: speed-up, efficiency, turning point, the fit across workloads, and the command."""
import math

import pytest

import mlflow
from opbench.record import TrialRecord
from opbench.studies.configs import best_config
from opbench.studies.threads import Scaling, fit_turning_points
from opbench.tracking import read_mlflow

from .cli import run_cli


def test_speedup_efficiency_and_turning_point():
    s = Scaling("w", "default", [1, 2, 4, 8], [8.0, 4.0, 3.0, 2.9])
    assert s.speedup == [1.0, 2.0, 8 / 3, 8 / 2.9]
    assert s.efficiency[1] == 1.0 and math.isclose(s.efficiency[2], 2 / 3)
    assert s.turning_point(0.1) == 4  # 4 -> 8 threads gains 3%
    assert s.turning_point(0.5) == 2  # 2 -> 4 threads gains 33%
    assert Scaling("w", "d", [1, 2], [2.0, 1.0]).turning_point(0.1) == 2  # still scaling at the last count


def test_turning_point_fit_recovers_a_linear_law():
    scalings = []
    for log_flops, turn in ((6.0, 2), (7.0, 4), (8.0, 8), (9.0, 8)):
        latencies = [1.0 / min(t, turn) for t in (1, 2, 4, 8)]
        scalings.append(Scaling(f"w{log_flops}", "default", [1, 2, 4, 8], latencies,
                                {"feat.log_flops": log_flops, "feat.arith_intensity": 10 ** (log_flops / 3)}))
    coefs, r2 = fit_turning_points(scalings, 0.1)
    assert r2 > 0.8 and coefs["log_flops"] + coefs["log_arith_intensity"] / 3 > 0
    assert fit_turning_points(scalings[:2], 0.1) is None  # too few workloads to fit


def test_best_config_ignores_references_and_failures():
    records = [TrialRecord.from_row(r) for r in (
        {"workload": "w", "status": "ok", "latency_ms": 1.0, "template": "torch", "reference": "torch"},
        {"workload": "w", "status": "wrong_result", "latency_ms": 0.1, "knob.a": 9},
        {"workload": "w", "status": "ok", "latency_ms": 2.0, "template": "matmul", "knob.a": 4},
        {"workload": "w", "status": "ok", "latency_ms": 3.0, "template": "matmul", "knob.a": 2})]
    assert best_config(records, "w") == {"a": 4} and best_config(records, "other") is None


@pytest.mark.slow
def test_threads_study_command(tmp_path, tracking_uri):
    uri = tracking_uri
    run_cli(*["tune", "add_relu:n=1,c=32,h=28,w=28", "--verify-rounds", "0", "--engine", "random", "--trials", "3", "--seed", "0",
                          "--tracking-uri", uri, "--study", "t", "--repeat", "2", "--no-references"], check=True)
    out = run_cli(*["study", "threads", "add_relu:n=1,c=32,h=28,w=28", "--threads", "1,2", "--best-from",
                                "t", "--tracking-uri", uri, "--repeat", "2", "--study", "s"], check=True)
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("add_relu")]
    assert [r[1] for r in rows] == ["default", "best"]
    for row in rows:
        one, two, speedup, eff, turn = map(float, row[2:7])
        assert math.isclose(speedup, one / two, rel_tol=1e-3) and math.isclose(eff, speedup / 2, rel_tol=1e-3)
        assert turn in (1, 2)
    frame = read_mlflow(["s"], uri)
    assert len(frame) == 4 and sorted(frame["threads"]) == [1, 1, 2, 2]
    client = mlflow.tracking.MlflowClient(uri)
    exp = client.get_experiment_by_name("s")
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`opbench.kind` = 'study'")[0]
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "plots")] == \
        ["plots/add_relu_n_1_c_32_h_28_w_28.png"]


def test_a_report_claims_a_speed_up_only_as_its_study_verified_it():
    from opbench.report.summary import summarize_engine

    trials = [TrialRecord(latency_ms=ms, gflops=1.0 / ms, finished_at=float(i)) for i, ms in enumerate((2.0, 1.0))]
    torch = TrialRecord(latency_ms=3.0, template="torch")
    verified = {trials[1].trial_id: {"verified_speedup_vs_torch": 2.5, "verified_speedup_vs_torch_min": 2.4,
                                     "verified_speedup_vs_torch_max": 2.7}}
    assert summarize_engine("random", trials, {"torch": torch}).vs_torch == "not verified"  # 3x as recorded: no claim
    assert summarize_engine("random", trials, {"torch": torch}, verified).vs_torch == "2.5x (2.4-2.7)"
    other = {trials[0].trial_id: verified[trials[1].trial_id]}  # a study verified another best: not this one's claim
    assert summarize_engine("random", trials, {"torch": torch}, other).vs_torch == "not verified"
