"""Helpers for tests that build and check many kernels."""
from __future__ import annotations

from typing import Any


def failures(records: list[dict[str, Any]], knobs: str = "knob.") -> list[tuple[str, str, dict[str, Any]]]:
    """Each record that is not ok: its workload, error and the knobs whose names start with ``knobs``."""
    return [(r["workload"], r["error"], {k: v for k, v in r.items() if k.startswith(knobs)})
            for r in records if r["status"] != "ok"]


def random_points(algorithm: str, knobs: tuple[str, ...], names: tuple[str, ...]) -> list[Any]:
    """A trial spec per workload named: the packed template's ``algorithm`` at a point of its ``knobs`` drawn at random
    (seeded by the workload's place in ``names``), on 1 and 2 threads in turn."""
    import random

    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec
    from opbench.space import get_template
    from opbench.workloads import parse_workload

    specs = []
    for index, name in enumerate(names):
        workload = parse_workload(name)
        template = get_template(workload)
        choices = {k.name: k.choices for k in template.knobs(workload)}
        assert algorithm in choices["algorithm"], name
        config = {"algorithm": algorithm, **{k: random.Random(index).choice(choices[k]) for k in knobs}}
        specs.append(TrialSpec(workload, template.validate(config, workload), Resources(1 + index % 2), template.name))
    return specs


def assert_rewrite_matches(mod: Any, x: Any, expected: Any, gone: str, made: str, tolerance: float = 1e-5) -> None:
    """A rewritten Relax module: ``gone`` no longer in its script, ``made`` in it, and its ``main`` built for the CPU
    gives ``expected`` on ``x``."""
    import numpy as np
    import tvm
    from tvm import relax

    text = mod.script()
    assert gone not in text and made in text
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, rtol=tolerance, atol=tolerance)
