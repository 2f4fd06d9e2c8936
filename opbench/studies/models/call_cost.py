"""The Relax VM's cost of one operator call on this host, timed rather than fitted: the per-call term of a whole
model's latency composed from its operators' (:class:`opbench.predictor.whole_model.Composition`).

Two chains of one parallel kernel too small to cost anything itself (a row of 16 values per thread, plus one),
:data:`SHORT` and :data:`LONG` calls long, each built as a Relax module and timed as a whole model is; a call's cost
is the difference between them over the calls between them (what one run of a module costs beside its calls
cancels). Fitted on the other models instead, the cost per call was 0.02-2.1 us where the one small model took part
in the fit and 7.6-33 us where it was the one held out (the big models' calls and operator times rise together).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from opbench.hardware.resources import Resources
from opbench.hardware.targets import make_target
from opbench.measure.models import export_model, save_inputs
from opbench.measure.protocol import ModelInput
from opbench.studies.models.profile import INPUTS

SHORT, LONG = 1, 65
NAME = "vm-call-cost"
LIBRARY = "chain.so"


def chain_names() -> tuple[str, str]:
    """The two chains' names, as models: short, long."""
    return f"{NAME}-{SHORT}", f"{NAME}-{LONG}"


def build_chains(root: Path, threads: int) -> list[ModelInput]:
    """Both chains built into folders of ``root`` named as :func:`chain_names`, as runs on ``threads``."""
    return [build_chain(root / name, calls, threads) for name, calls in zip(chain_names(), (SHORT, LONG))]


def build_chain(folder: Path, calls: int, threads: int) -> ModelInput:
    """A Relax module calling the one-row-per-thread kernel ``calls`` times in a row, each on the last's output,
    exported with its input (zeros) and expected output (``calls`` everywhere)."""
    shape = (threads, 16)
    export_model(_chain(shape, calls), make_target("llvm", threads), folder / LIBRARY)
    save_inputs([np.zeros(shape, "float32")], folder / INPUTS, np.full(shape, calls, "float32"))
    return ModelInput(folder.name, library=str(folder / LIBRARY), inputs=str(folder / INPUTS),
                      resources=Resources(threads))


def per_call_ms(short_ms: float, long_ms: float) -> float:
    """The cost of one call from the two chains' latencies (ms)."""
    return (long_ms - short_ms) / (LONG - SHORT)


def _chain(shape: tuple[int, int], calls: int) -> Any:
    from tvm import relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with builder.function("main", [x]):
        kernel = builder.add_func(_add_one(shape), "add_one")
        with builder.dataflow():
            y: Any = x
            for _ in range(calls):
                y = builder.emit(relax.call_tir(kernel, [y], relax.TensorType(shape, "float32")))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def _add_one(shape: tuple[int, int]) -> Any:
    """``b = a + 1`` on ``shape``: its rows in parallel, each a vector."""
    import tvm
    from tvm import te

    a = te.placeholder(shape, "float32", name="a")
    b = te.compute(shape, lambda i, j: a[i, j] + 1.0, name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    rows, lanes = sch.get_loops(sch.get_sblock("b"))
    sch.parallel(rows)
    sch.vectorize(lanes)
    return sch.mod["main"].with_attr("global_symbol", "add_one")
