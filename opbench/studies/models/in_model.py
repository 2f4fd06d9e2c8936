"""Each tuned operator keeps its tuned schedule only where the model runs it faster than the template
default (docs/measurement.md#in-model): an operator is tuned alone, where its repeated calls keep its
weights in the cache, and a schedule faster there can be slower inside the model.

The model is built twice, with the tuned schedules and with the defaults in their place, and both
builds are profiled call by call (:func:`profile_built`) in alternating rounds; an operator whose
default's calls took less time in all keeps its default (or TVM's default lowering, where its default
was no faster than that)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from opbench.studies.models.tuned import TunedOp, is_default

log = logging.getLogger("opbench")

ROUNDS = 2  # profiles of each build, alternating: a slow spell of the host falls on both
RUNS = 3  # model runs a profile times (after one warm-up)


def keep_faster_in_model(chosen: dict[str, TunedOp], defaults: dict[str, TunedOp | None], library: Path,
                         build: Callable[[list[TunedOp], str], Path],
                         profile: Callable[[Path, int], dict[str, float]]) -> dict[str, TunedOp]:
    """``chosen`` (by operator name; the model built with it: ``library``) with each tuned operator whose
    default (``defaults``; None: TVM's default lowering) takes less time a model run inside the model than
    its tuned schedule replaced by it. ``build(ops, name)`` builds the model with ``ops`` (the rest untuned)
    into a library; ``profile(library, runs)`` is ms a model run per operator name."""
    tuned = sorted(name for name, op in chosen.items() if not is_default(op))
    if not tuned:
        return chosen
    alternative = {**chosen, **{name: defaults[name] for name in tuned}}
    builds = {"tuned": library,
              "defaults": build([op for op in alternative.values() if op is not None], "in-model-defaults")}
    total = {which: dict.fromkeys(tuned, 0.0) for which in builds}
    for n in range(ROUNDS):
        for which in builds if n % 2 == 0 else reversed(builds):
            per_op = profile(builds[which], RUNS)
            for name in tuned:  # one a build does not call (none here): 0 in both, its tuned schedule kept
                total[which][name] += per_op.get(name, 0.0)
    kept = dict(chosen)
    for name in tuned:
        faster = total["defaults"][name] < total["tuned"][name]
        log.info("    %s inside the model: tuned %.4g ms a run, default %.4g: it keeps the %s", name,
                 total["tuned"][name] / ROUNDS, total["defaults"][name] / ROUNDS, "default" if faster else "tuned")
        if faster:
            default = defaults[name]
            if default is None:
                del kept[name]
            else:
                kept[name] = default
    return kept
