"""The contract every schedule template keeps, shipped for plugin authors (as
:mod:`opbench.testing.engine_contract` is for engines): run the ``check_*`` functions over your template
and the workloads it claims, as OpBench's own suite runs them over every template of its registry.

:func:`check_space` needs TVM but builds nothing (seconds); :func:`check_builds_correct_kernels` builds,
runs and checks kernels through a :class:`~opbench.measure.measurer.Measurer`.
"""
from __future__ import annotations

import random
from typing import Any

from opbench.exceptions import ConfigError
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.types import TrialSpec
from opbench.record import is_ok
from opbench.space import Config
from opbench.space._base import Template
from opbench.workloads import Workload


def sample_configs(template: Template, workload: Workload, count: int, seed: int = 0) -> list[Config]:
    """``count`` points of the template's space for ``workload``, each knob drawn uniformly."""
    rng = random.Random(seed)
    knobs = template.knobs(workload)
    return [{k.name: rng.choice(k.choices) for k in knobs} for _ in range(count)]


def check_space(template: Template, workload: Workload, samples: int = 25, seed: int = 0) -> None:
    """The default config is a point of the space; sampled points validate and apply to the workload's
    TensorIR and leave it as it was (a model operator's PrimFunc is cached and shared by every schedule of it in the
    process: TVM's schedule mutates in place IR it believes only it holds); the NNI space lists every knob's choices;
    an unknown knob, and a value outside a knob's choices, are :class:`~opbench.exceptions.ConfigError` naming the
    knob."""
    import tvm
    import tvm_ffi
    from tvm import s_tir

    knobs = {k.name: k for k in template.knobs(workload)}
    default = template.default_config(workload)
    assert set(default) <= set(knobs), f"default knobs outside the space: {set(default) - set(knobs)}"
    assert template.validate(default, workload) == default, "the default config does not validate as it is"
    space = template.search_space(workload)
    assert {name: list(k.choices) for name, k in knobs.items()} == {n: list(s["_value"]) for n, s in space.items()}
    unscheduled = tvm_ffi.structural_hash(workload.prim_func())
    for config in [default, *sample_configs(template, workload, samples, seed)]:
        sch = s_tir.Schedule(tvm.IRModule({"main": workload.prim_func()}))
        template.apply(sch, template.validate(config, workload), workload)
        assert tvm_ffi.structural_hash(workload.prim_func()) == unscheduled, f"{config} changed the unscheduled PrimFunc"
    _expect_config_error(template, workload, {"no_such_knob": 1}, "no_such_knob")
    if knobs:
        name = next(iter(knobs))
        _expect_config_error(template, workload, {name: object()}, name)


def _expect_config_error(template: Template, workload: Workload, config: dict[str, Any], knob: str) -> None:
    try:
        template.validate(config, workload)
    except ConfigError as exc:
        assert exc.knob == knob, f"the error names {exc.knob!r}, not {knob!r}"
        return
    raise AssertionError(f"{config!r} was accepted")


def check_builds_correct_kernels(measurer: Measurer, template: Template, workload: Workload, samples: int = 3,
                                 seed: int = 0, threads: int = 1) -> None:
    """The default and ``samples`` sampled configs build, run and match the workload's reference: every
    record's status is ok (an invalid config is a template bug: its space offered it)."""
    configs = [template.default_config(workload), *sample_configs(template, workload, samples, seed)]
    records = measurer.measure_batch([TrialSpec(workload, c, Resources(threads), template.name) for c in configs])
    failed = [(r["status"], r.get("error", "")[:300]) for r in records if not is_ok(r)]
    assert not failed, f"{template.name} on {workload.name}: {failed}"
