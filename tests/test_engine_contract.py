"""The contract every ask/tell engine of the registry keeps, checked with a fake measurer in seconds
(as ``optuna/testing/pytest_samplers.py`` checks every sampler): the tuning loop ends at its budget,
every measured config is valid and inside the space, each record reaches the engine once, failed
trials are heard without ending the study, and seeded engines repeat themselves."""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import pytest

from opbench.engines.loop import ENGINE_TRIAL_TAG, run_tuning
from opbench.engines.registry import ENGINES, LOOP_ENGINES, EngineSpec, create_engine, create_loop_engine
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.measure.types import TrialSpec
from opbench.record import KNOB_PREFIX, Record, Status, new_trial_id
from opbench.space import get_template
from opbench.workloads import parse_workload

WORKLOAD = parse_workload("matmul:m=64,n=64,k=64")
TEMPLATE = get_template(WORKLOAD)
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


class FakeMeasurer:
    """Measures nothing: a config's latency is a fixed function of its knobs; some configs fail."""

    def __init__(self, fail: Callable[[dict], bool] = lambda config: False) -> None:
        self.fail = fail
        self.configs: list[dict] = []

    @staticmethod
    def latency(config: dict) -> float:
        return 1.0 + zlib.crc32(repr(sorted(config.items())).encode()) % 1000 / 1000

    def measure_batch(self, specs: list[TrialSpec], on_record: Callable[[Record], None]) -> list[Record]:
        out = []
        for spec in specs:
            self.configs.append(spec.config)
            failed = self.fail(spec.config)
            record: Record = {"trial_id": new_trial_id(), "workload": WORKLOAD.name, "threads": spec.resources.threads,
                              "status": (Status.RUN_ERROR if failed else Status.OK).value,
                              "error": "fake crash" if failed else "", **spec.tags,
                              **{KNOB_PREFIX + k: v for k, v in spec.config.items()}}
            if not failed:
                record["latency_ms"] = self.latency(spec.config)
            on_record(record)
            out.append(record)
        return out


def _engine(name: str, tmp_path, study: str = "contract", resume: bool = False, storage: str | None = None,
            propose_default: bool = True):
    spec = SPECS[name]
    if spec.name == "optuna":  # a store on disk only where a second engine must find the study again
        spec = EngineSpec(spec.name, spec.sampler, seed=spec.seed, storage=storage or "sqlite:///:memory:")
    return create_engine(spec, TEMPLATE.search_space(WORKLOAD), WORKLOAD, TEMPLATE, Resources(), study, resume,
                         propose_default=propose_default)


def _tune_fake(engine, measurer: FakeMeasurer, count: int, batch: int = 3) -> list[Record]:
    stored: list[Record] = []
    told: list[str] = []  # what the engine heard, and whether the record was stored by then
    tell = engine.tell

    def spy(proposal, record: Record) -> None:
        told.append(record["trial_id"] if record in stored else "told before it was stored")
        tell(proposal, record)

    engine.tell = spy
    records = run_tuning(engine, WORKLOAD, count, measurer, stored.append, Resources(), batch=batch)  # type: ignore[arg-type]
    assert stored == records  # every record is stored (on_record) before the loop returns it ...
    assert told == [r["trial_id"] for r in records]  # ... and the engine hears each, once, after it is stored
    return records


def test_the_registry_covers_every_engine(tmp_path):
    assert {s.name for s in SPECS.values()} | set(LOOP_ENGINES) == set(ENGINES)
    with pytest.raises(OpBenchError, match="runs its own search loop"):
        create_engine(EngineSpec("metaschedule"), {}, WORKLOAD, TEMPLATE, Resources(), "x")
    with pytest.raises(OpBenchError, match="proposes configs one by one"):
        create_loop_engine(EngineSpec("random"), tmp_path)


@pytest.mark.parametrize("name", SPECS)
def test_the_first_trial_of_a_fresh_study_is_the_template_default(name, tmp_path):
    engine = _engine(name, tmp_path)
    measurer = FakeMeasurer()
    _tune_fake(engine, measurer, 4, batch=2)
    engine.close()
    assert measurer.configs[0] == TEMPLATE.default_config(WORKLOAD)
    assert measurer.configs.count(measurer.configs[0]) == 1 or name == "model"  # heard, not proposed again


@pytest.mark.parametrize("name", SPECS)
def test_an_engine_that_observed_the_measured_default_goes_past_it(name, tmp_path):
    """tune-model measures every operator's default before it ranks them; the key operators' engines
    learn that default (``observe``) rather than spend a trial on it again."""
    default = TEMPLATE.default_config(WORKLOAD)
    engine = _engine(name, tmp_path, propose_default=False)
    engine.observe(default, Resources().threads, FakeMeasurer.latency(default))
    measurer = FakeMeasurer()
    _tune_fake(engine, measurer, 4, batch=2)
    if name.startswith("optuna"):
        assert engine.done == 4  # the learnt default is not one of the study's measured trials
        learnt = [t for t in engine.study.trials if t.state.name == "COMPLETE" and "status" not in t.user_attrs]
        assert len(learnt) == 1 and learnt[0].value == FakeMeasurer.latency(default)
    engine.close()
    assert measurer.configs[0] != default and len(measurer.configs) == 4


@pytest.mark.parametrize("name", SPECS)
def test_the_loop_ends_at_its_budget_with_valid_configs_inside_the_space(name, tmp_path):
    engine = _engine(name, tmp_path)
    measurer = FakeMeasurer()
    records = _tune_fake(engine, measurer, 10)
    engine.close()
    assert len(records) == 10
    assert len({r[ENGINE_TRIAL_TAG] for r in records}) == 10  # each proposal reaches the engine once
    space = TEMPLATE.search_space(WORKLOAD)
    for config in measurer.configs:
        TEMPLATE.validate(config, WORKLOAD)  # invalid proposals were rejected before measuring
        assert set(config) == set(space) and all(v in space[k]["_value"] for k, v in config.items())
    assert engine.objectives == ("latency",)  # one objective: the Pareto summary is skipped


@pytest.mark.parametrize("name", SPECS)
def test_failed_trials_are_heard_and_the_study_goes_on(name, tmp_path):
    engine = _engine(name, tmp_path)
    failing = FakeMeasurer(fail=lambda config: config.get("vectorize") == 1)
    records = _tune_fake(engine, failing, 8, batch=2)
    engine.close()
    assert len(records) == 8 and any(r["status"] == Status.RUN_ERROR for r in records)  # failures heard, study went on
    if name.startswith("optuna"):  # a failed trial is FAIL in the study, with its error, not a fake latency
        states = {t.user_attrs["trial_id"]: t for t in engine.study.trials if "trial_id" in t.user_attrs}
        for record in records:
            trial = states[record["trial_id"]]
            assert (trial.state.name == "FAIL") == (record["status"] == Status.RUN_ERROR)
            assert trial.state.name == "FAIL" or math.isclose(trial.value, record["latency_ms"])


@pytest.mark.parametrize("name", SEEDED)
def test_a_seeded_engine_proposes_the_same_configs_again(name, tmp_path):
    first, second = FakeMeasurer(), FakeMeasurer()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _tune_fake(_engine(name, tmp_path / "a"), first, 6)
    _tune_fake(_engine(name, tmp_path / "b"), second, 6)
    assert first.configs == second.configs


@pytest.mark.parametrize("store", ["optuna-journal.log", "sqlite:///{}/optuna.db"])  # the default, and a database URL
@pytest.mark.parametrize("name", [n for n in SPECS if SPECS[n].name == "optuna"])
def test_a_resumed_engine_knows_what_is_done_and_goes_on(name, store, tmp_path):
    storage = store.format(tmp_path) if "://" in store else str(tmp_path / store)
    engine = _engine(name, tmp_path, storage=storage)
    records = _tune_fake(engine, FakeMeasurer(), 5)
    engine.close()
    resumed = _engine(name, tmp_path, resume=True, storage=storage)
    assert resumed.done == 5
    assert resumed.recover({str(r[ENGINE_TRIAL_TAG]): r for r in records}) == []  # it heard them all already
    more = _tune_fake(resumed, FakeMeasurer(), 3)
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
