"""The held-out protocol: folds never train on what they score, a random pick's expectation, both summaries."""
import itertools
import statistics

import numpy as np
import pandas as pd
import pytest

from opbench.exceptions import OpBenchError
from opbench.predictor.heldout import HeldOutResult, TaskScore, groups_of, held_out_study, make_folds, random_top_k
from opbench.predictor.model import LatencyModel


def _frame(n_per_task: int = 24, seed: int = 0) -> pd.DataFrame:
    """Random configs of six tasks; two names of matmul-512 among them, which are one task."""
    rng = np.random.default_rng(seed)
    names = ["matmul-512", "matmul:m=512,n=512,k=512", "dense:m=64,n=64,k=64", "conv2d:n=1,c=8,h=8,w=8,k=8,r=3,s=3",
             "batch_matmul:b=2,m=32,n=32,k=32", "softmax:m=64,n=128", "pool2d:n=1,c=8,h=16,w=16,r=2,s=2"]
    rows = []
    for t, name in enumerate(names):
        x = rng.uniform(0, 4, n_per_task)
        rows += [{"workload": name, "op": name.split(":")[0].split("-")[0], "status": "ok", "feat.flops": 1e6 * (t + 1),
                  "feat.x": v, "feat.t": float(t), "latency_ms": (t + 1) * np.exp(0.5 * v)} for v in x]
    return pd.DataFrame(rows)


def test_a_random_picks_expected_top_k_is_the_brute_force_mean():
    latencies = [3.0, 1.0, 2.0, 5.0, 4.0, 2.5]
    for k in (1, 2, 3, 5, 6):
        brute = statistics.fmean(min(latencies) / min(c) for c in itertools.combinations(latencies, k))
        assert random_top_k(latencies, k) == pytest.approx(brute)
    assert random_top_k([2.0, 1.0], 5) == 1.0  # k past the rows: every row is picked


def test_the_two_summaries_on_a_hand_made_table():
    def score(group, task, best, top1, top5, rows, error):
        return TaskScore(group, task, 0, rows, best, {1: top1, 5: top5}, {1: 0.3, 5: 0.7}, 0.5, 1.0, error)

    result = HeldOutResult("op", [["a"], ["b"]], [score("a", "a1", 1.0, 2.0, 1.0, 10, 0.1),
                                                  score("b", "b1", 2.0, 2.0, 2.0, 10, 0.2),
                                                  score("b", "b2", 1.0, 4.0, 1.0, 20, 0.4)])
    summary = result.summaries()
    assert summary["tenset_top1"] == pytest.approx((0.5 + (1.0 + 0.25) / 2) / 2)  # the mean of the groups' means
    assert summary["tlp_top1"] == pytest.approx((1 + 2 + 1) / (2 + 2 + 4))  # pooled over every task
    assert summary["tenset_top5"] == summary["tlp_top5"] == 1.0 and summary["random_top1"] == pytest.approx(0.3)
    assert summary["below_random"] == 0
    assert summary["mape"] == pytest.approx((10 * 0.1 + 10 * 0.2 + 20 * 0.4) / 40)  # over every row


def test_no_fold_ever_trains_on_a_held_out_groups_rows():
    frame = _frame()
    trained_on: list[set[str]] = []

    class Recording(LatencyModel):
        def fit(self, rows):
            trained_on.append(set(groups_of(rows, "workload")))
            return super().fit(rows)

    result = held_out_study(frame, "workload", seeds=2, model=lambda seed: Recording(seed=seed, n_estimators=20))
    assert len(result.folds) == 6 and ["matmul:m=512,n=512,k=512"] in result.folds  # two names, one task
    assert len(trained_on) == 12
    for held, seen in zip(result.folds * 2, trained_on):
        assert not seen & set(held) and len(seen) == 5
    groups = result.by_group()
    assert set(groups["group"]) == set(groups_of(frame, "workload")) and (groups["top1"] <= 1).all()
    assert (groups.loc[groups["group"] == "matmul:m=512,n=512,k=512", "rows"] == 48).all()


def test_seeds_studied_apart_and_joined_score_as_the_seeds_studied_together():
    frame = _frame()
    model = lambda seed: LatencyModel(seed=seed, n_estimators=20)
    together = held_out_study(frame, "workload", seeds=2, model=model)
    apart = HeldOutResult.joined([held_out_study(frame, "workload", seeds=[seed], model=model) for seed in (0, 1)])
    assert apart.folds == together.folds and {s.seed for s in apart.scores} == {0, 1}
    pd.testing.assert_frame_equal(apart.by_group(), together.by_group())
    assert apart.summaries() == together.summaries()
    with pytest.raises(OpBenchError, match="same hold-out and folds"):
        HeldOutResult.joined([together, held_out_study(frame, "workload", folds=2, model=model)])


def test_folds_and_bad_hold_outs():
    assert make_folds(list("abcdef"), 3, seed=1) == make_folds(list("abcdef"), 3, seed=1)
    assert sorted(g for fold in make_folds(list("abcdef"), 3) for g in fold) == list("abcdef")
    with pytest.raises(OpBenchError, match="at least 2 groups"):
        make_folds(["a", "a"], None)
    with pytest.raises(OpBenchError, match="unknown hold-out 'sideways'"):
        groups_of(_frame(), "sideways")
    with pytest.raises(OpBenchError, match="needs a 'source_model' column"):
        groups_of(_frame(), "model")


def test_the_study_command_prints_every_group_and_both_summaries_and_saves_the_folds(tmp_path, capsys):
    import json

    from opbench.cli import main
    from opbench.tracking.dataset import write_dataset

    data = write_dataset(_frame(n_per_task=12), tmp_path / "d.parquet")
    assert main(["predictor", "study", "--data", str(data), "--hold-out", "op", "--folds", "3",
                 "--out", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    assert all(op in out for op in ("matmul", "dense", "conv2d", "batch_matmul", "softmax", "pool2d"))
    assert "TenSet (mean of the groups): top-1" in out and "TLP (pooled over every task): top-1" in out
    folds = json.loads((tmp_path / "study" / "folds.json").read_text())
    assert folds["hold_out"] == "op" and sorted(g for f in folds["folds"] for g in f) == sorted(set(_frame()["op"]))


@pytest.mark.parametrize("name", ["normalised", "pairwise", "capped", "graded", "pairwise-compiled", "ensemble-compiled",
                                  "ensemble-capped", "ensemble-near-best"])
def test_a_task_ranker_orders_the_configs_of_tasks_it_never_saw(name):
    from opbench.predictor.heldout import predictor

    result = held_out_study(_frame(), "workload", model=predictor(name))
    groups = result.by_group()
    ordered = 0.6 if name == "capped" else 0.8  # capped leaves configs slower than CAP times the best unordered
    assert len(groups) == 6 and (groups["spearman"] > ordered).all()  # faster as feat.x falls, in every task
    assert (groups["top1"] > groups["random_top1"]).all() and (groups["top5"] == 1.0).all()


def test_the_compiled_ranker_leaves_out_metaschedules_per_store_means_and_keeps_the_assembly():
    from opbench.predictor.heldout import predictor

    frame = _frame().assign(**{"feat.ms000": 1.0, "feat.ms_stores": 2.0, "feat.asm_lanes_per_fp": 16.0})
    kept = predictor("pairwise-compiled")(0).fit(frame).columns
    assert sorted(kept) == ["feat.asm_lanes_per_fp", "feat.flops", "feat.t", "feat.x"]
    assert "feat.ms000" in predictor("pairwise")(0).fit(frame).columns


def test_an_ensemble_sums_its_members_scores_standardised_within_each_task():
    """Two tasks whose member scores differ by 100x in scale score alike: what counts is each member's order and
    spacing within a task, and the two members' disagreements are settled by their standardised sum."""
    from opbench.predictor.ranking import RankerEnsemble

    class Given:
        columns = ["feat.x"]

        def __init__(self, scores):
            self.scores = np.asarray(scores, dtype=float)

        def fit(self, frame):
            return self

        def predict(self, frame):
            return self.scores

    frame = pd.DataFrame({"workload": ["matmul-512"] * 3 + ["softmax:m=64,n=128"] * 3})
    ensemble = RankerEnsemble([Given([1, 2, 3, 100, 200, 300]), Given([3, 1, 2, 30, 10, 20])]).fit(frame)
    score = ensemble.predict(frame)

    def standardised(values):
        values = np.asarray(values, dtype=float)
        return (values - values.mean()) / values.std()

    assert score[:3] == pytest.approx(score[3:])
    assert score[:3] == pytest.approx(standardised([1, 2, 3]) + standardised([3, 1, 2]))
    assert ensemble.columns == ["feat.x"]


def test_near_best_objectives_train_on_a_tasks_fastest_configs():
    """graded: slowdowns within one step of GRADE are one label (a pair of them is not trained), a step further is
    the next; capped: slowdowns beyond CAP all count as CAP, rows weighted by their relative throughput."""
    from opbench.predictor.ranking import CAP, GRADE, task_labels

    relative = np.array([1.0, 1 / GRADE ** 0.5, 1 / GRADE ** 1.5, 1 / CAP, 1 / (4 * CAP)])
    graded, weight = task_labels("graded", relative)
    steps = [np.floor(np.log(CAP) / np.log(GRADE)), np.floor(np.log(4 * CAP) / np.log(GRADE))]
    assert list(graded) == [0, 0, -1, -steps[0], -steps[1]] and weight is None and steps[1] > steps[0] > 1
    assert list(task_labels("graded", np.array([1.0, 1 / GRADE ** 2]))[0]) == [0, -2]  # exactly two steps
    capped, weight = task_labels("capped", relative)
    assert capped == pytest.approx([0, np.log(GRADE) / 2, 1.5 * np.log(GRADE), np.log(CAP), np.log(CAP)])
    assert list(weight) == list(relative)
    assert task_labels("normalised", relative)[0][4] == pytest.approx(np.log(4 * CAP))


def test_an_unknown_predictor_or_objective_is_named():
    from opbench.predictor.heldout import predictor
    from opbench.predictor.ranking import TaskRanker

    with pytest.raises(OpBenchError, match="unknown predictor 'oracle'; predictors: latency, normalised, pairwise, capped, "
                                            "graded, pairwise-compiled, ensemble-compiled, ensemble-capped, "
                                            "ensemble-near-best"):
        predictor("oracle")
    with pytest.raises(OpBenchError, match="unknown ranking objective 'listwise'"):
        TaskRanker("listwise")


def test_a_model_engine_without_update_keeps_the_model_its_warm_start_trained():
    """TenSet's xgb-no-update arm: the study's own trials never retrain the warm-started model; with updates
    they do (each ask retrains on what was observed since)."""
    import random

    from opbench.engines.model_engine import ModelEngine
    from opbench.hardware.resources import Resources, host_facts
    from opbench.measure.features import static_features
    from opbench.space import get_template
    from opbench.workloads import parse_workload

    other, target = parse_workload("matmul:m=64,n=64,k=128"), parse_workload("matmul:m=64,n=64,k=64")
    template, rng, resources = get_template(other), random.Random(0), Resources(1)
    space = template.search_space(other)
    rows = []
    for _ in range(40):
        config = template.validate({k: rng.choice(v["_value"]) for k, v in space.items()}, other)
        rows.append({**static_features(other, config, template.name, resources, host_facts()), "status": "ok",
                     "latency_ms": rng.uniform(0.1, 1.0), "workload": other.name})
    warm = pd.DataFrame(rows)
    space = template.search_space(target)
    for update, after in ((False, 40), (True, 42)):
        engine = ModelEngine(space, resources, target, template, seed=0, warm_start=warm, pool=16, update=update)
        proposals = engine.ask(2)
        assert engine.trained_on == 40
        for proposal in proposals:
            engine.learn(proposal.config, proposal.threads, 0.5)
        engine.ask(2)
        assert engine.trained_on == after


def _benchmark_module(monkeypatch, name: str):
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    return importlib.import_module(name)


def test_a_verified_label_is_the_faster_of_two_measurements_and_the_recorded_one_is_kept(tmp_path, monkeypatch):
    labels = _benchmark_module(monkeypatch, "_verified_labels")
    frame = pd.DataFrame({"trial_id": ["a", "b", "c"], "status": "ok", "latency_ms": [2.0, 1.0, 3.0]})
    same, line = labels.verified(frame, tmp_path)
    assert same is frame and "as recorded" in line
    again = pd.DataFrame({"trial_id": ["a", "b", "c"], "verified_latency_ms": [1.5, 1.2, float("nan")]})
    again.to_parquet(tmp_path / labels.VERIFIED)
    out, line = labels.verified(frame, tmp_path)
    assert out["latency_ms"].tolist() == [1.5, 1.0, 3.0]  # a: faster again; b: slower again keeps 1.0; c: failed again
    assert out["recorded_latency_ms"].tolist() == [2.0, 1.0, 3.0]
    assert "2 records measured again" in line and "1 of them more than 10% faster" in line


def test_records_near_their_tasks_fastest_and_whole_tasks_are_the_ones_measured_again(monkeypatch):
    labels = _benchmark_module(monkeypatch, "_verified_labels")
    latencies = {"m1": ("matmul-512", 1.0), "m2": ("matmul:m=512,n=512,k=512", 1.9), "m3": ("matmul-512", 2.5),
                 "d1": ("dense:m=8,n=64,k=64", 4.0), "d2": ("dense:m=8,n=64,k=64", 40.0)}
    records = [{"trial_id": t, "workload": w, "status": "ok", "latency_ms": ms} for t, (w, ms) in latencies.items()]
    records.append({"trial_id": "x", "workload": "matmul-512", "status": "error", "latency_ms": 0.0})
    assert {r["trial_id"] for r in labels.near_best(records, 2.0)} == {"m1", "m2", "d1"}  # one task under two names
    dense = records[3]["workload"]
    from opbench.workloads import task_key_of

    assert {r["trial_id"] for r in labels.near_best(records, 2.0, {task_key_of(dense)})} == {"m1", "m2", "d1", "d2"}


def test_a_verification_measures_each_record_again_once_and_resumes(tmp_path, monkeypatch, measurer):
    from opbench.engines.loop import run_tuning
    from opbench.engines.simple import RandomEngine
    from opbench.hardware.resources import Resources
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.space import get_template
    from opbench.tracking.jsonl import JsonlWriter, read_jsonl
    from opbench.workloads import parse_workload

    labels = _benchmark_module(monkeypatch, "_verified_labels")
    workload = parse_workload("matmul:m=32,n=32,k=32")
    engine = RandomEngine(get_template(workload).search_space(workload), 1, seed=0)
    run_tuning(engine, workload, 3, measurer, JsonlWriter(tmp_path / "records.jsonl").write, Resources(1), batch=3)
    recorded = read_jsonl(tmp_path / "records.jsonl")
    ok = set(recorded.loc[recorded["status"] == "ok", "trial_id"])
    timing = TimingPolicy(repeat=3, min_repeat_ms=5.0)
    labels.verify(tmp_path, "records.jsonl", timing, lambda _: None, near=float("inf"))
    again = pd.read_parquet(tmp_path / labels.VERIFIED)
    assert ok and set(again["trial_id"]) == ok and again["verified_latency_ms"].gt(0).all()
    monkeypatch.setattr(Measurer, "__enter__", lambda self: pytest.fail("a finished verification measured again"))
    labels.verify(tmp_path, "records.jsonl", timing, lambda _: None, near=float("inf"))
    assert pd.read_parquet(tmp_path / labels.VERIFIED).equals(again)


def test_a_device_held_out_is_predicted_zero_shot_and_with_k_of_its_measurements():
    """Two devices, the second 3x slower with its own order of configs in one task: zero-shot it is ranked as
    the first device ranks it; k of its measurements join the training set and leave the scored rows."""
    first = _frame().assign(device_key="zen3/2c")
    second = _frame(seed=1).assign(device_key="zen4/2c", latency_ms=lambda f: 3 * f["latency_ms"])
    frame = pd.concat([first, second], ignore_index=True)
    trained: list[int] = []

    class Counting(LatencyModel):
        def fit(self, rows):
            trained.append(len(rows))
            return super().fit(rows)

    zero = held_out_study(frame, "device", model=lambda seed: Counting(seed=seed, n_estimators=20))
    assert sorted(map(tuple, zero.folds)) == [("zen3/2c",), ("zen4/2c",)] and trained == [len(first)] * 2
    tuned = held_out_study(frame, "device", few_shot=16, model=lambda seed: Counting(seed=seed, n_estimators=20))
    assert trained[2:] == [len(first) + 16] * 2  # the other device's rows and 16 of the held-out one's
    assert sum(s.rows for s in tuned.scores) == len(frame) - 2 * 16  # those 16 are never scored
    with pytest.raises(OpBenchError, match="--hold-out device needs two groups or more; the dataset holds one"):
        held_out_study(first, "device")


def test_labels_near_their_tasks_best_are_measured_again_noisy_ones_too(monkeypatch):
    labels = _benchmark_module(monkeypatch, "_verified_labels")
    records = [{"status": "ok", "trial_id": t, "workload": "matmul:m=8,n=8,k=8", "latency_ms": ms, "latency_cv": cv}
               for t, ms, cv in (("steady", 1.0, 0.01), ("noisy", 1.5, 0.5), ("slow", 5.0, 0.01))]
    assert [r["trial_id"] for r in labels.near_best(records, 2.0)] == ["steady", "noisy"]
