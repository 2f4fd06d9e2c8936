"""Each tuned operator keeps its tuned schedule only where the model runs it faster than the template
default (docs/measurement.md#in-model): an operator is tuned alone, where its repeated calls keep its
weights in the cache, and a schedule faster there can be slower inside the model.

The model is built twice, with the tuned schedules and with the defaults in their place, and both
builds are profiled call by call in the measurer's workers, their placements interleaved
(:meth:`~opbench.measure.measurer.Measurer.profile_models`); an operator whose default's calls took less time
keeps its default (or TVM's default lowering, where its default was no faster than that)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from opbench.studies.models.tuned import TunedOp, is_default

log = logging.getLogger("opbench")

RUNS = 3  # model runs a profile times (after one warm-up)


def keep_faster_in_model(chosen: dict[str, TunedOp], defaults: dict[str, TunedOp | None], library: Path,
                         build: Callable[[list[TunedOp], str], Path],
                         profile: Callable[[Sequence[Path], int], list[dict[str, float]]]) -> dict[str, TunedOp]:
    """``chosen`` (by operator name; the model built with it: ``library``) with each tuned operator whose
    default (``defaults``; None: TVM's default lowering) takes less time a model run inside the model than
    its tuned schedule replaced by it. ``build(ops, name)`` builds the model with ``ops`` (the rest untuned)
    into a library; ``profile(libraries, runs)`` is, per library, ms a model run per operator name."""
    tuned = sorted(name for name, op in chosen.items() if not is_default(op))
    if not tuned:
        return chosen
    alternative = {**chosen, **{name: defaults[name] for name in tuned}}
    builds = {"tuned": library,
              "defaults": build([op for op in alternative.values() if op is not None], "in-model-defaults")}
    per_op = dict(zip(builds, profile(list(builds.values()), RUNS)))
    kept = dict(chosen)
    for name in tuned:
        tuned_ms, default_ms = (per_op[which].get(name, 0.0) for which in ("tuned", "defaults"))  # uncalled: 0 in both
        faster = default_ms < tuned_ms
        log.info("    %s inside the model: tuned %.4g ms a run, default %.4g: it keeps the %s", name,
                 tuned_ms, default_ms, "default" if faster else "tuned")
        if faster:
            default = defaults[name]
            if default is None:
                del kept[name]
            else:
                kept[name] = default
    return kept
