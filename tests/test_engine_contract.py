"""The shipped engine contract (:mod:`opbench.testing.engine_contract`) run over every ask/tell engine of
the registry, with what each engine adds (Optuna's study states, resume), in seconds."""
from __future__ import annotations

import math

import pytest

from opbench.engines.loop import ENGINE_TRIAL_TAG
from opbench.engines.registry import ENGINES, LOOP_ENGINES, EngineSpec, create_engine, create_loop_engine
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.record import Status
from opbench.testing import engine_contract as contract
from opbench.testing.engine_contract import TEMPLATE, WORKLOAD

SPECS = {
    "optuna-tpe": EngineSpec("optuna", "tpe", seed=1),
    "optuna-random": EngineSpec("optuna", "random", seed=1),
    "nni-tpe": EngineSpec("nni", tuner="TPE", seed=1),
    "nni-evolution": EngineSpec("nni", tuner="Evolution", seed=1),
    "random": EngineSpec("random", seed=1),
    "grid": EngineSpec("grid"),
    "model": EngineSpec("model", seed=1),
}
SEEDED = ("optuna-tpe", "optuna-random", "random", "grid")


def _engine(name: str, tmp_path, study: str = "contract", resume: bool = False, storage: str | None = None):
    spec = SPECS[name]
    if spec.name == "optuna":  # a store on disk only where a second engine must find the study again
        spec = EngineSpec(spec.name, spec.sampler, seed=spec.seed, storage=storage or "sqlite:///:memory:")
    return create_engine(spec, TEMPLATE.search_space(WORKLOAD), WORKLOAD, TEMPLATE, Resources(), study, resume)


def _make(name: str, tmp_path) -> contract.MakeEngine:
    return lambda space: _engine(name, tmp_path)


def test_the_registry_covers_every_engine(tmp_path):
    assert {s.name for s in SPECS.values()} | set(LOOP_ENGINES) == set(ENGINES)
    with pytest.raises(OpBenchError, match="runs its own search loop"):
        create_engine(EngineSpec("metaschedule"), {}, WORKLOAD, TEMPLATE, Resources(), "x")
    with pytest.raises(OpBenchError, match="proposes configs one by one"):
        create_loop_engine(EngineSpec("random"), tmp_path)


@pytest.mark.parametrize("name", SPECS)
def test_the_first_trial_of_a_fresh_study_is_the_template_default(name, tmp_path):
    contract.check_the_first_trial_is_the_template_default(_make(name, tmp_path), learns_by_repeating=name == "model")


@pytest.mark.parametrize("name", [n for n in SPECS if SPECS[n].name == "optuna"])
def test_an_optuna_study_holds_its_budget_of_trials_the_default_first_each_linked_to_its_record(name, tmp_path):
    engine = _engine(name, tmp_path)
    records = contract.tune_fake(engine, contract.FakeMeasurer(), 4, batch=2)
    trials = engine.study.trials
    assert len(trials) == engine.done == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert [t.user_attrs["trial_id"] for t in trials] == [r["trial_id"] for r in records]
    assert trials[0].params == {k: v for k, v in TEMPLATE.default_config(WORKLOAD).items() if k in trials[0].params}
    engine.enqueue(TEMPLATE.default_config(WORKLOAD), 1)  # already run: a shared or resumed study is not given it twice
    assert len(engine.study.trials) == 4


@pytest.mark.parametrize("name", SPECS)
def test_the_loop_ends_at_its_budget_with_valid_configs_inside_the_space(name, tmp_path):
    contract.check_the_loop_ends_at_its_budget_inside_the_space(_make(name, tmp_path))
    assert _engine(name, tmp_path).objectives == ("latency",)  # one objective: the Pareto summary is skipped


@pytest.mark.parametrize("name", SPECS)
def test_failed_trials_are_heard_and_the_study_goes_on(name, tmp_path):
    engine, records = contract.check_failed_trials_are_heard_and_the_study_goes_on(_make(name, tmp_path))
    if name.startswith("optuna"):  # a failed trial is FAIL in the study, with its error, not a fake latency
        states = {t.user_attrs["trial_id"]: t for t in engine.study.trials if "trial_id" in t.user_attrs}
        for record in records:
            trial = states[record["trial_id"]]
            assert (trial.state.name == "FAIL") == (record["status"] == Status.RUN_ERROR)
            assert trial.state.name == "FAIL" or math.isclose(trial.value, record["latency_ms"])


@pytest.mark.parametrize("name", SEEDED)
def test_a_seeded_engine_proposes_the_same_configs_again(name, tmp_path):
    contract.check_a_seeded_engine_repeats_itself(_make(name, tmp_path))


@pytest.mark.parametrize("store", ["optuna-journal.log", "sqlite:///{}/optuna.db"])  # the default, and a database URL
@pytest.mark.parametrize("name", [n for n in SPECS if SPECS[n].name == "optuna"])
def test_a_resumed_engine_knows_what_is_done_and_goes_on(name, store, tmp_path):
    storage = store.format(tmp_path) if "://" in store else str(tmp_path / store)
    engine = _engine(name, tmp_path, storage=storage)
    records = contract.tune_fake(engine, contract.FakeMeasurer(), 5)
    engine.close()
    resumed = _engine(name, tmp_path, resume=True, storage=storage)
    assert resumed.done == 5
    assert resumed.recover({str(r[ENGINE_TRIAL_TAG]): r for r in records}) == []  # it heard them all already
    more = contract.tune_fake(resumed, contract.FakeMeasurer(), 3)
    assert len(more) == 3 and resumed.done == 8


def test_the_pareto_front_is_the_non_dominated_ok_records_for_any_objective_pair():
    from opbench.record import pareto_front

    a = {"trial_id": "a", "status": "ok", "latency_ms": 1.0, "threads": 2, "energy_j": 0.5}
    b = {"trial_id": "b", "status": "ok", "latency_ms": 2.0, "threads": 1, "energy_j": 0.4}
    c = {"trial_id": "c", "status": "ok", "latency_ms": 3.0, "threads": 2, "energy_j": 0.3}  # slower than a on 2 threads
    twin = {**a, "trial_id": "twin"}  # equal on every count: the front keeps one
    failed = {"trial_id": "f", "status": "run_error", "latency_ms": 0.1, "threads": 1}
    unmetered = {"trial_id": "u", "status": "ok", "latency_ms": 0.5, "threads": 1}  # no energy reading
    records = [a, b, c, twin, failed, unmetered]
    assert [r["trial_id"] for r in pareto_front(records, ("latency", "threads"))] == ["u"]  # it beats all on both
    assert [r["trial_id"] for r in pareto_front([a, b, c, twin, failed], ("latency", "threads"))] == ["b", "a"]
    assert [r["trial_id"] for r in pareto_front(records, ("latency", "energy"))] == ["c", "b", "a"]
