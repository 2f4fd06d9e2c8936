"""Helpers for tests that build and check many kernels."""
from __future__ import annotations

from typing import Any


def failures(records: list[dict[str, Any]], knobs: str = "knob.") -> list[tuple[str, str, dict[str, Any]]]:
    """Each record that is not ok: its workload, error and the knobs whose names start with ``knobs``."""
    return [(r["workload"], r["error"], {k: v for k, v in r.items() if k.startswith(knobs)})
            for r in records if r["status"] != "ok"]


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
