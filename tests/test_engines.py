"""Engines beyond one Optuna process: NNI (in-process; nnictl in test_nnictl.py), MetaSchedule,
Optuna workers sharing a storage, multi-objective studies, and `opbench report`."""
import json

import optuna
import pytest
import yaml

import mlflow
from opbench.cli import main
from opbench.engines.optuna.storage import open_storage
from opbench.exceptions import OpBenchError, SearchSpaceError
from opbench.integration.nni.experiment import MODEL_TUNER, ORDER_SAFE_TPE, ExperimentSpec, write_experiment
from opbench.tracking import read_mlflow
from opbench.tracking.dataset import load_records
from opbench.tracking.dataset.metaschedule_import import import_metaschedule

from .cli import run_cli, run_cli_process
from .conftest import ROOT

SMALL = "matmul:m=64,n=64,k=64"
SHIPPED = {  # experiment folder -> the `opbench nni new` arguments that write it
    "matmul-512-tpe": ExperimentSpec("matmul-512", "TPE", 64, threads=2),
    "resnet50-c2-evolution": ExperimentSpec("resnet50-c2", "Evolution", 64, threads=2),
    "bert-base-ffn1-anneal": ExperimentSpec("bert-base-ffn1", "Anneal", 64, threads=2),
    "matmul-512-model": ExperimentSpec("matmul-512", "Model", 64, threads=2),
    "matmul-512-threads-tile-grid": ExperimentSpec("matmul-512", "GridSearch", 40, search_threads=[1, 2],
                                                   knobs={"i_split": ["512x1x1", "256x1x2", "128x1x4", "64x1x8", "32x1x16"],
                                                          "j_split": ["64x1x8", "32x1x16", "16x1x32", "8x1x64"]}),
}


def _tune(tracking_uri, study, *extra):
    return run_cli("tune", SMALL, "--verify-rounds", "0", "--tracking-uri", tracking_uri, "--study", study, "--repeat", "2",
                   *extra, check=True)


def _parent_run(tracking_uri, study, kind="study"):
    client = mlflow.tracking.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(study)
    return client, client.search_runs([exp.experiment_id], filter_string=f"tags.`opbench.kind` = '{kind}'")[0]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_experiments_are_what_nni_new_writes(tmp_path, name):
    written = write_experiment(SHIPPED[name], tmp_path / name)
    shipped = ROOT / "experiments" / name
    ours, theirs = yaml.safe_load(written.read_text()), yaml.safe_load((shipped / "config.yml").read_text())
    assert theirs.pop("trialCodeDirectory") == "../.." and ours.pop("trialCodeDirectory")
    if "className" in theirs["tuner"]:  # a custom tuner, imported from the project root too
        assert theirs["tuner"].pop("codeDirectory") == "../.." and ours["tuner"].pop("codeDirectory")
        assert theirs["tuner"]["className"] == {"Model": MODEL_TUNER, "TPE": ORDER_SAFE_TPE}[SHIPPED[name].tuner]
    else:
        assert theirs["tuner"]["name"] == SHIPPED[name].tuner
    assert ours == theirs
    assert json.loads((tmp_path / name / "search_space.json").read_text()) == \
        json.loads((shipped / "search_space.json").read_text())
    assert "opbench.integration.nni.trial" in theirs["trialCommand"]


def test_nni_new_rejects_unknown_knobs_and_values(tmp_path, capsys):
    with pytest.raises(SearchSpaceError, match="knob 'bogus'"):
        write_experiment(ExperimentSpec("matmul-512", knobs={"bogus": None}), tmp_path / "x")
    with pytest.raises(SearchSpaceError, match=r"values \['3x1x1'\]"):
        write_experiment(ExperimentSpec("matmul-512", knobs={"i_split": ["3x1x1"]}), tmp_path / "x")
    with pytest.raises(SystemExit) as exit_:
        main(["nni", "new", "matmul-512", "--tuner", "Nope", "--out", str(tmp_path / "y")])
    assert exit_.value.code == 2 and "invalid choice: 'Nope'" in capsys.readouterr().err


def test_nni_tuner_in_process(tracking_uri):
    out = _tune(tracking_uri, "n", "--engine", "nni", "--tuner", "Anneal", "--trials", "4", "--no-references")
    frame = read_mlflow(["n"], tracking_uri)
    assert len(frame) == 4 and set(frame["engine"]) == {"nni-anneal"}
    assert "\nbest " in out.stdout  # the summary table's row of the best config


@pytest.mark.slow
def test_metaschedule_candidates_are_measured_checked_recorded_with_traces_and_import_back(tmp_path, tracking_uri):
    run_cli_process("tune", SMALL, "--verify-rounds", "0", "--tracking-uri", tracking_uri, "--study", "ms", "--repeat", "2",
                    "--engine", "metaschedule", "--trials", "6", "--seed", "0", "--no-references")
    frame = read_mlflow(["ms"], tracking_uri)
    assert len(frame) == 6 and set(frame["template"]) == {"metaschedule"} and set(frame["engine"]) == {"metaschedule"}
    ok = frame[frame["status"] == "ok"]
    assert len(ok) >= 4 and (ok["max_abs_err"] < 1e-3).all()  # checked against the reference
    assert ok["knob.ir_file"].is_unique
    client = mlflow.tracking.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("ms")
    run = client.search_runs([exp.experiment_id], filter_string=f"tags.trial_id = '{ok.iloc[0]['trial_id']}'")[0]
    [artifact] = client.list_artifacts(run.info.run_id, "metaschedule")
    trace = open(client.download_artifacts(run.info.run_id, artifact.path, str(tmp_path))).read()
    assert "sch.get_sblock" in trace or "get_sblock" in trace
    _, parent = _parent_run(tracking_uri, "ms")
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "metaschedule")}
    assert "metaschedule/database_tuning_record.json" in names

    # Its database imports as records: MetaSchedule's run_secs are the core loop's medians.
    command = ["dataset", "import-metaschedule", str(tmp_path / "metaschedule" / "ms"), "--tracking-uri", tracking_uri,
               "--study", "imp", "--out", str(tmp_path / "imp.parquet")]
    out = run_cli(*command, check=True)
    assert f"{len(frame)} records read from {tmp_path / 'metaschedule' / 'ms'}: {len(frame)} added to study 'imp'" in out.stdout
    imported = load_records("mlflow", ["imp"], tracking_uri=tracking_uri)
    assert len(imported) == len(frame) and set(imported["op"]) == {"tir"}
    out = run_cli(*command, check=True)  # again: its ids come from the records, so nothing is added twice
    assert f"0 added to study 'imp', {len(frame)} it already held" in out.stdout
    assert len(load_records("mlflow", ["imp"], tracking_uri=tracking_uri)) == len(frame)
    assert sorted(imported["latency_ms"].dropna().round(9)) == sorted(ok["latency_ms"].round(9))
    assert imported["feat.flops"].eq(2 * 64 ** 3).all() and imported["feat.ms000"].notna().all()
    with pytest.raises(OpBenchError, match="not a MetaSchedule JSON database"):
        import_metaschedule(tmp_path, "x")


@pytest.mark.slow
def test_two_workers_share_one_optuna_journal(tmp_path, tracking_uri):
    storage = str(tmp_path / "optuna-journal.log")
    _tune(tracking_uri, "w2", "--workers", "2", "--trials", "8", "--storage", storage, "--seed", "5",
          "--no-references")
    study = optuna.load_study(study_name="w2", storage=open_storage(storage))
    measured = [t for t in study.trials if "status" in t.user_attrs]
    rejected = [t for t in study.trials if "rejected" in t.user_attrs]  # invalid configs, no trial spent
    assert len(measured) == 8 and len(study.trials) == 8 + len(rejected)
    frame = read_mlflow(["w2"], tracking_uri)
    assert len(frame) == 8 and frame["engine_trial"].astype(str).is_unique
    assert set(frame["trial_id"]) == {t.user_attrs["trial_id"] for t in measured}
    _, parent = _parent_run(tracking_uri, "w2")
    assert parent.data.metrics["best_latency_ms"] == frame[frame["status"] == "ok"]["latency_ms"].min()


def test_multi_objective_study_reports_a_pareto_front(tmp_path, tracking_uri):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    out = _tune(tracking_uri, "mo", "--sampler", "nsga2", "--objectives", "latency,threads", "--search-threads",
                "1,2", "--trials", "6", "--storage", storage, "--seed", "2", "--no-references")
    assert "Pareto front (latency vs threads)" in out.stdout
    study = optuna.load_study(study_name="mo", storage=storage)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    assert all(len(t.values) == 2 for t in study.best_trials)
    client, parent = _parent_run(tracking_uri, "mo")
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "plots")} == \
        {"plots/tuning_curve.png", "plots/pareto_front.png"}


def test_objectives_need_a_thread_search(tracking_uri, capsys):
    assert main(["tune", SMALL, "--objectives", "latency,threads", "--tracking-uri", tracking_uri]) == 2
    assert "needs --search-threads" in capsys.readouterr().err


def test_report_draws_curves_per_engine_and_the_best_tir(tmp_path, tracking_uri):
    _tune(tracking_uri, "rep", "--engine", "random", "--trials", "3", "--seed", "1", "--search-threads", "1,2")
    _tune(tracking_uri, "rep", "--engine", "grid", "--trials", "2", "--no-references")
    out = run_cli(*["report", "rep", "--tracking-uri", tracking_uri, "--out", str(tmp_path / "r")], check=True)
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line[:1].isalpha()}
    assert lines["random"][1] == "3" and lines["grid"][1] == "2"
    assert " ".join(lines["random"][-2:]) == "not verified"  # --verify-rounds 0: no speed-up over torch is claimed
    pngs = sorted(p.name for p in (tmp_path / "r").glob("*.png"))
    assert pngs == ["curve_vs_time.png", "curve_vs_trial.png", "latency_vs_threads.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in (tmp_path / "r").glob("*.png"))
    assert "@T.prim_func" in (tmp_path / "r" / "best_schedule.py").read_text()
    client, report = _parent_run(tracking_uri, "rep", kind="report")
    assert {a.path for a in client.list_artifacts(report.info.run_id, "report")} == \
        {f"report/{n}" for n in [*pngs, "best_schedule.py"]}


def test_tpe_takes_a_result_that_comes_after_the_trials_end():
    """NNI's dispatcher can hand TPE a trial's end before its result (two threads); NNI's own TPE then
    raises KeyError and the dispatcher dies (microsoft/nni#5689). OpBench's TPE takes the result."""
    from nni.algorithms.hpo.tpe_tuner import TpeTuner

    from opbench.engines.nni.tuners import OrderSafeTpe

    space = {"x": {"_type": "choice", "_value": [1, 2, 3]}}
    for tuner_class, survives in ((TpeTuner, False), (OrderSafeTpe, True)):
        tuner = tuner_class("minimize", seed=0)
        tuner.update_search_space(space)
        params = tuner.generate_parameters(0)
        tuner.trial_end(0, True)
        if survives:
            tuner.receive_trial_result(0, params, 1.5)
            assert tuner.generate_parameters(1)["x"] in (1, 2, 3)
        else:
            with pytest.raises(KeyError):
                tuner.receive_trial_result(0, params, 1.5)


def test_tpe_keeps_one_parameter_set_waiting_in_nni_s_queue():
    """Beyond what the manager asks for, one set is issued through the dispatcher's callback, once: the
    manager then always has the next trial queued when a trial ends."""
    from opbench.engines.nni.tuners import LOOKAHEAD_IDS, OrderSafeTpe

    issued: dict[int, list] = {1: [], 0: []}
    for lookahead, sent in issued.items():
        tuner = OrderSafeTpe("minimize", seed=0, lookahead=lookahead)
        tuner.update_search_space({"x": {"_type": "choice", "_value": [1, 2, 3]}})
        first = tuner.generate_multiple_parameters([0], st_callback=lambda *args, sent=sent: sent.append(args))
        second = tuner.generate_multiple_parameters([1], st_callback=lambda *args, sent=sent: sent.append(args))
        assert len(first) == len(second) == 1
    assert [i for i, _ in issued[1]] == [LOOKAHEAD_IDS] and issued[0] == []
    assert issued[1][0][1]["x"] in (1, 2, 3)
