"""A model operator timed as the model runs it: its weight packed once, before the timed calls.

Packed templates mark the copy that packs a weight (``meta_schedule.layout_rewrite_preproc``). In a
model, Relax's ``SplitLayoutRewritePreproc`` moves it into a function of its own that runs once at
build time on the constant weight. A trial whose ``layout_transform`` is ``weights_prepacked`` is
split the same way (:func:`split_prepack`): its library holds ``main``, the operator on the packed
weight, and ``prepack``, the copy. A manifest beside the library says which argument is packed and
to what shape; the worker runs ``prepack`` once when it loads the kernel (:func:`prepacked_args`),
then checks and times ``main`` alone. MetaSchedule's builder likewise leaves the rewrite out of
what it times (``RemoveWeightLayoutRewriteBlock``), feeding random data in the packed shape; here
the real weight is packed, so the output is checked.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from opbench.exceptions import ConfigError

MAIN, PREPACK = "main", "prepack"  # the library's functions


@dataclass(frozen=True)
class Prepack:
    """``main``'s argument ``arg`` is the weight packed by ``prepack`` to ``shape`` (``dtype``)."""

    arg: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """The packed weight's size: memory a model holds for it, packed once outside the operator."""
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def split_prepack(mod: Any) -> tuple[Any, Prepack | None]:
    """``mod``'s ``main`` with its marked weight packing split off as ``prepack`` (None: there is none)."""
    import tvm
    from tvm import relax

    prim = mod[MAIN]
    params = list(prim.params)  # the buffers: inputs, then the output
    builder = relax.BlockBuilder()
    inputs = [relax.Var(f"arg{i}", relax.TensorType(b.shape, b.dtype)) for i, b in enumerate(params[:-1])]
    with builder.function("main", inputs):
        op = builder.add_func(prim, "op")
        with builder.dataflow():
            out = builder.emit_output(relax.call_tir(op, inputs, relax.TensorType(params[-1].shape, params[-1].dtype)))
        builder.emit_func_output(out)
    funcs = {gv.name_hint: f for gv, f in relax.transform.SplitLayoutRewritePreproc()(builder.get()).functions.items()}
    if "op_prepacked" not in funcs:
        return mod, None
    packed, copy = funcs["op_prepacked"], funcs["op_weight_prepack"]
    if len(copy.params) != 2:
        raise ConfigError("layout_transform", f"weights_prepacked packs one weight; this operator packs "
                                              f"{len(copy.params) - 1}")
    arg = next(i for i, (a, b) in enumerate(zip(packed.params, params)) if not _same_shape(a, b))
    split = tvm.IRModule({MAIN: packed.with_attr("global_symbol", MAIN),
                          PREPACK: copy.with_attr("global_symbol", PREPACK)})
    return split, Prepack(arg, tuple(int(n) for n in copy.params[-1].shape), str(copy.params[-1].dtype))


def _same_shape(a: Any, b: Any) -> bool:
    return [int(n) for n in a.shape] == [int(n) for n in b.shape]


def manifest_path(artifact: str) -> str:
    return artifact + ".prepack.json"


def write_manifest(artifact: str, prepack: Prepack) -> None:
    with open(manifest_path(artifact), "w") as f:
        json.dump(asdict(prepack), f)


def read_manifest(artifact: str) -> Prepack | None:
    """The manifest beside a kernel library; None when its weights are not prepacked."""
    if not os.path.exists(manifest_path(artifact)):
        return None
    with open(manifest_path(artifact)) as f:
        fields = json.load(f)
    return Prepack(fields["arg"], tuple(fields["shape"]), fields["dtype"])


def prepacked_args(module: Any, args: list[Any], prepack: Prepack | None,
                   empty: Callable[[tuple[int, ...], str], Any]) -> list[Any]:
    """``args`` as ``main`` takes them: the weight replaced by its packed copy, made once by ``prepack`` into
    ``empty(shape, dtype)`` (where the other arguments were placed)."""
    if prepack is None:
        return args
    packed = empty(prepack.shape, prepack.dtype)
    module[PREPACK](args[prepack.arg], packed)
    return [packed if i == prepack.arg else a for i, a in enumerate(args)]
