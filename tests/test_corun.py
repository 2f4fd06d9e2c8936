"""Inter-operator studies: co-run trials, the interference study, collaborative tuning and placement."""
import math

import optuna
import pytest

import mlflow
from opbench.cli import main
from opbench.engines.optuna.storage import JOURNAL_FILE, open_storage
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.measure.corun import CoRunSpec
from opbench.measure.types import TrialSpec
from opbench.studies import placement as game
from opbench.studies.corun import layouts_for, parse_layout
from opbench.tracking import Recorder, read_mlflow
from opbench.workloads import parse_workload

from .cli import run_cli

MATMUL, SOFTMAX = parse_workload("matmul:m=96,n=96,k=96"), parse_workload("softmax:m=128,n=512")


def _spec(workload, cores, config=None):
    return TrialSpec(workload, config or {}, Resources(len(cores), cores))


def test_full_corun_records_each_slowdown_against_its_solo_latency(measurer, tracking_uri):
    spec = CoRunSpec((_spec(MATMUL, (0,)), _spec(SOFTMAX, (1,))), "full", window_s=0.2)
    with Recorder("co", tracking_uri) as recorder:
        records = measurer.corun(spec)
        for record in records:
            recorder(record)
    parent, first, second = records
    assert parent["record_kind"] == "corun" and parent["status"] == "ok", parent.get("error")
    assert parent["started_late_ms"] >= 0  # recorded: how late after the barrier the last member started
    for member, workload in ((first, MATMUL), (second, SOFTMAX)):
        assert member["corun_id"] == parent["trial_id"] and member["workload"] == workload.name
        assert member["status"] == "ok" and member["latency_ms"] > 0 and member["repeat"] >= 3
        assert math.isclose(member["slowdown"], member["latency_ms"] / member["solo_latency_ms"])
        assert member["max_abs_err"] < 1e-3  # each kernel was checked before timing
    assert first["corun_with"] == SOFTMAX.name and first["cores"] == "0" and second["cores"] == "1"
    assert math.isclose(parent["makespan_ms"], max(first["latency_ms"], second["latency_ms"]))
    # MLflow: the co-run is a run of its own with the members nested under it; the dataset sees both.
    members = read_mlflow(["co"], tracking_uri)
    coruns = read_mlflow(["co"], tracking_uri, kind="corun")
    assert len(coruns) == 1 and coruns.loc[0, "makespan_ms"] == pytest.approx(parent["makespan_ms"])
    assert set(members["corun_id"]) == {parent["trial_id"]} and len(members) == 2
    client = mlflow.tracking.MlflowClient(tracking_uri)
    corun_run = recorder.mlflow.trial_runs[parent["trial_id"]]
    assert client.get_run(recorder.mlflow.trial_runs[first["trial_id"]]).data.tags["mlflow.parentRunId"] == corun_run


def test_oversubscribed_cores_are_measured_against_each_members_solo_run(measurer):
    both = (0, 1)  # four threads on two cores; how much slower that is is a benchmark's number, not a test's
    parent, first, second = measurer.corun(CoRunSpec((_spec(MATMUL, both), _spec(MATMUL, both)), "full", 0.3))
    assert parent["status"] == "ok", parent.get("error")
    for member in (first, second):
        assert member["cores"] == "0,1" and member["threads"] == 2
        assert math.isclose(member["slowdown"], member["latency_ms"] / member["solo_latency_ms"])


def test_stream_corun_interleaves_the_members_on_one_core_set(measurer):
    parent, first, second = measurer.corun(CoRunSpec((_spec(MATMUL, (0,)), _spec(SOFTMAX, (0,))), "stream", 0.2))
    assert parent["status"] == "ok", parent.get("error")
    assert parent["makespan_ms"] > 0 and first["cores"] == second["cores"] == "0"
    assert parent["solo_makespan_ms"] == pytest.approx(first["solo_latency_ms"] + second["solo_latency_ms"])
    with pytest.raises(OpBenchError, match="same threads and cores"):
        measurer.corun(CoRunSpec((_spec(MATMUL, (0,)), _spec(SOFTMAX, (1,))), "stream", 0.2))


@pytest.mark.parametrize("mode, status", [(1, "run_error"), (2, "timeout")])
def test_a_crashing_or_hanging_member_fails_the_corun_not_the_study(measurer, mode, status):
    faulty = parse_workload(f"faulty:n=64,mode={mode}")
    parent, bad, partner = measurer.corun(CoRunSpec((_spec(faulty, (0,)), _spec(SOFTMAX, (1,))), "full", 0.2))
    assert parent["status"] == status and bad["status"] == status and partner["status"] == status
    assert "co-run" in parent["error"] and "latency_ms" not in partner
    parent, *_ = measurer.corun(CoRunSpec((_spec(MATMUL, (0,)), _spec(SOFTMAX, (1,))), "full", 0.1))
    assert parent["status"] == "ok"  # fresh workers replace the dead ones


def test_layouts():
    assert [l.label for l in layouts_for(2, (0, 1))] == ["0|1", "0,1|0,1"]
    assert [l.label for l in layouts_for(2, (0, 1, 2))] == ["0|1,2", "0,1|2", "0,1,2|0,1,2"]
    assert parse_layout("0,1", 3).shared and parse_layout("0|1", 2).resources()[1] == Resources(1, (1,))
    with pytest.raises(OpBenchError, match="2 core sets for 3 workloads"):
        parse_layout("0|1", 3)


def test_study_corun_prints_a_slowdown_matrix_and_logs_a_heatmap(tmp_path, tracking_uri):
    out = run_cli(*["study", "corun", MATMUL.name, SOFTMAX.name, "--layouts", "0|1", "0,1",
                                "--window", "0.1", "--tracking-uri", tracking_uri, "--study", "inter"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "slowdown, full 0|1" in out.stdout and "slowdown, full 0,1|0,1" in out.stdout
    coruns = read_mlflow(["inter"], tracking_uri, kind="corun")
    assert len(coruns) == 6 and set(coruns["status"]) == {"ok"}  # 3 pairs (self-pairs included) x 2 layouts
    client = mlflow.tracking.MlflowClient(tracking_uri)
    study_run = client.search_runs([client.get_experiment_by_name("inter").experiment_id],
                                   "tags.`opbench.kind` = 'study'")[0]
    assert [a.path for a in client.list_artifacts(study_run.info.run_id, "plots")] == ["plots/slowdown.png"]


def test_tune_together_compares_collaborative_with_independent_tuning(tmp_path, tracking_uri):
    out = run_cli(*["tune-together", MATMUL.name, SOFTMAX.name, "--trials", "3", "--window", "0.1",
                                "--tracking-uri", tracking_uri, "--study", "tog"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "independent + co-run" in out.stdout and "collaborative gain: x" in out.stdout
    coruns = read_mlflow(["tog"], tracking_uri, kind="corun")
    collaborative = coruns[coruns["approach"] == "collaborative"]
    independent = coruns[coruns["approach"] == "independent"]
    assert len(collaborative) == 3 and len(independent) == 2  # the winners co-run in both layouts
    trials = read_mlflow(["tog"], tracking_uri)
    assert len(trials[(trials["approach"] == "independent") & trials["corun_id"].isna()]) == 6  # 3 per op alone
    storage = open_storage(str(tmp_path / "optuna" / "tog" / JOURNAL_FILE))  # the default: a journal beside the store
    joint = optuna.load_study(study_name="tog-joint", storage=storage)
    done = [t for t in joint.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3 and {"0.i_split", "1.inner_split", "layout"} <= set(done[0].params)
    best = min(done, key=lambda t: t.value)  # the study's objective is the co-run's makespan
    assert best.value == pytest.approx(collaborative["makespan_ms"].min())


def _congestion_oracle():
    """A known game: each player's cost is its base cost on a device times how many share it."""
    base = [[4.0, 6.0], [4.0, 6.0], [1.0, 1.5]]  # players x devices

    def measure(profile):
        return [math.inf if d is None else base[p][d] * sum(1 for q in profile if q == d)
                for p, d in enumerate(profile)]
    return game.CostOracle(measure)


def test_best_response_dynamics_reaches_an_equilibrium_that_exhaustive_search_bounds():
    oracle = _congestion_oracle()
    dynamics = game.best_response_dynamics(oracle, (0, 0, 0), devices=2, eps=0.0)
    assert dynamics.converged and game.is_equilibrium(oracle, dynamics.profile, 2, 0.0)
    optimum, cost = game.exhaustive(oracle, 3, 2, "makespan")
    assert cost == min(oracle.social(p, "makespan") for p in [(a, b, c) for a in (0, 1) for b in (0, 1)
                                                               for c in (0, 1)])
    assert cost == 8.0 and optimum in [(0, 1, 0), (1, 0, 0), (0, 0, 1)]  # worked out by hand
    assert dynamics.profile == (1, 0, 0) and dynamics.moves == [(0, 1)]
    assert game.price_of_anarchy(oracle.social(dynamics.profile, "makespan"), cost) == 1.0
    assert game.greedy(oracle, 3, 2) == (0, 1, 0)  # big players first, each to its cheapest device


def test_place_measures_every_placement_and_finds_an_equilibrium(tracking_uri):
    out = run_cli(*["place", MATMUL.name, SOFTMAX.name, "--devices", "0;0,1", "--window", "0.1",
                                "--tracking-uri", tracking_uri, "--study", "pl"])
    # Whether best-response dynamics converges on these measured costs depends on the measurements (a
    # busy host can make it cycle); the exit code says which, and the dynamics are tested on a fixed game.
    converged = "converged;" in out.stdout and "an eps-equilibrium" in out.stdout
    assert out.returncode == (0 if converged else 1), out.stdout[-2000:] + out.stderr[-2000:]
    assert "best-response dynamics from first:" in out.stdout and "price of anarchy" in out.stdout
    coruns = read_mlflow(["pl"], tracking_uri, kind="corun")
    full = coruns[coruns["workload"] == f"{MATMUL.name}+{SOFTMAX.name}"]
    # 2 devices ^ 2 players, each measured once
    assert len(full) == 4 and set(full["status"]) == {"ok"}, full[["status", "error"]].to_string()
    client = mlflow.tracking.MlflowClient(tracking_uri)
    study_run = client.search_runs([client.get_experiment_by_name("pl").experiment_id],
                                   "tags.`opbench.kind` = 'study'")[0]
    assert study_run.data.metrics["optimum_cost_ms"] == pytest.approx(full["makespan_ms"].min())
    assert study_run.data.metrics["price_of_anarchy"] >= 1.0


@pytest.mark.parametrize("args, message", [
    (["place", "matmul-512", "--devices", "0;1"], "place needs at least 2 workloads"),
    (["place", "matmul-512", "matmul-512", "--devices", "0"], "placement needs at least 2 devices"),
    (["place", "matmul-512", "matmul-512", "--devices", "0;cuda"], "device 'cuda'"),
    (["study", "corun", "matmul-512", "softmax:m=8,n=8", "--modes", "bogus"], "unknown co-run mode(s) ['bogus']"),
    (["study", "corun", "matmul-512", "softmax:m=8,n=8", "--layouts", "0|1|0"], "3 core sets for 2 workloads"),
    (["tune-together", "matmul-512", "nope-1"], "unknown workload 'nope-1'"),
])
def test_bad_corun_input_is_a_clear_error(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err
