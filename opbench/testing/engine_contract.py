"""The contract every ask/tell engine keeps, shipped for plugin authors (as Optuna ships
``optuna/testing/pytest_samplers.py``): run the ``check_*`` functions over your engine, as OpBench's own
suite runs them over every engine of its registry, in seconds and without TVM (a fake measurer).

``make`` is a function of ``space`` returning a fresh engine over it (the search space of :data:`TEMPLATE` for
:data:`WORKLOAD`). The tuning loop gives a fresh study the template default through :meth:`Engine.enqueue`,
the one way an engine is given it: an engine proposes it first, once, and learns its record.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from opbench.engines._base import Engine, Space
from opbench.engines.loop import ENGINE_TRIAL_TAG, run_tuning
from opbench.hardware.resources import Resources
from opbench.measure.types import TrialSpec
from opbench.record import Status, TrialRecord
from opbench.space import get_template
from opbench.workloads import parse_workload

WORKLOAD = parse_workload("matmul:m=64,n=64,k=64")
TEMPLATE = get_template(WORKLOAD)
MakeEngine = Callable[[Space], Engine]


class FakeMeasurer:
    """Measures nothing: a config's latency is a fixed function of its knobs; configs ``fail`` picks fail."""

    def __init__(self, fail: Callable[[dict], bool] = lambda config: False) -> None:
        self.fail = fail
        self.configs: list[dict] = []

    @staticmethod
    def latency(config: dict) -> float:
        return 1.0 + zlib.crc32(repr(sorted(config.items())).encode()) % 1000 / 1000

    def measure_batch(self, specs: list[TrialSpec], on_record: Callable[[TrialRecord], None]) -> list[TrialRecord]:
        out = []
        for spec in specs:
            self.configs.append(spec.config)
            failed = self.fail(spec.config)
            record = TrialRecord(workload=WORKLOAD.name, threads=spec.resources.threads,
                                 status=(Status.RUN_ERROR if failed else Status.OK).value,
                                 error="fake crash" if failed else "", knobs=dict(spec.config),
                                 latency_ms=None if failed else self.latency(spec.config))
            record.set(**spec.tags)
            on_record(record)
            out.append(record)
        return out


def tune_fake(engine: Engine, measurer: FakeMeasurer, count: int, batch: int = 3, fresh: bool = True) -> list[TrialRecord]:
    """``count`` trials of ``engine`` through the real tuning loop (of a ``fresh`` study: the template default
    first), checking that every record is stored before the loop returns it and that the engine hears each one
    once, after it is stored."""
    stored: list[TrialRecord] = []
    told: list[str] = []
    tell = engine.tell

    def spy(proposal: Any, record: TrialRecord) -> None:
        told.append(record["trial_id"] if record in stored else "told before it was stored")
        tell(proposal, record)

    engine.tell = spy  # type: ignore[method-assign]
    records = run_tuning(engine, WORKLOAD, count, measurer, stored.append, Resources(), batch=batch,  # type: ignore[arg-type]
                         fresh=fresh)
    assert stored == records, "a record reached the engine's loop result without being stored"
    assert told == [r["trial_id"] for r in records], "the engine did not hear each record once, after it was stored"
    return records


def space() -> Space:
    return TEMPLATE.search_space(WORKLOAD)


def check_the_first_trial_is_the_template_default(make: MakeEngine, learns_by_repeating: bool = False) -> None:
    """A fresh study measures the template default first, once, as one of its budget's trials (unless the
    engine ``learns_by_repeating``, it does not propose it again); a study that is not fresh does not."""
    engine, measurer = make(space()), FakeMeasurer()
    records = tune_fake(engine, measurer, 4, batch=2)
    engine.close()
    default = TEMPLATE.default_config(WORKLOAD)
    assert len(records) == 4 and measurer.configs[0] == default
    assert learns_by_repeating or measurer.configs.count(default) == 1
    engine, measurer, enqueued = make(space()), FakeMeasurer(), []
    engine.enqueue = lambda config, threads: enqueued.append(config)  # type: ignore[method-assign]
    tune_fake(engine, measurer, 3, fresh=False)
    engine.close()
    assert len(measurer.configs) == 3 and enqueued == []  # a study that is not fresh is not given the default


def check_the_loop_ends_at_its_budget_inside_the_space(make: MakeEngine) -> None:
    """Ten trials end the loop; each reaches the engine once; every measured config is a valid point."""
    engine, measurer = make(space()), FakeMeasurer()
    records = tune_fake(engine, measurer, 10)
    engine.close()
    assert len(records) == 10 and len({r[ENGINE_TRIAL_TAG] for r in records}) == 10
    for config in measurer.configs:
        TEMPLATE.validate(config, WORKLOAD)  # invalid proposals are rejected before measuring
        assert set(config) == set(space()) and all(v in space()[k]["_value"] for k, v in config.items())


def check_failed_trials_are_heard_and_the_study_goes_on(make: MakeEngine) -> tuple[Engine, list[TrialRecord]]:
    """Trials that fail (here: every ``vectorize=1``) are told as failures and the loop still ends at its
    budget; returns the (closed) engine and the records, for engine-specific checks."""
    engine = make(space())
    records = tune_fake(engine, FakeMeasurer(fail=lambda config: config.get("vectorize") == 1), 8, batch=2)
    engine.close()
    assert len(records) == 8 and any(r["status"] == Status.RUN_ERROR for r in records)
    return engine, records


def check_a_seeded_engine_repeats_itself(make: MakeEngine) -> None:
    """Two engines made alike (the same seed) propose the same configs."""
    first, second = FakeMeasurer(), FakeMeasurer()
    tune_fake(make(space()), first, 6)
    tune_fake(make(space()), second, 6)
    assert first.configs == second.configs
