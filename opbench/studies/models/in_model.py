"""Each operator that leaves its template default, for a tuned schedule or for TVM's default lowering, keeps
that choice only where the model runs it faster than the default (docs/measurement.md#in-model): an operator
is timed alone, where its repeated calls keep its weights in the cache, and what is faster there can be slower
inside the model.

The model is built twice, with the choices and with the defaults in their place, and both builds are profiled
call by call in the measurer's workers, their placements interleaved
(:meth:`~opbench.measure.measurer.Measurer.profile_models`); an operator whose default's calls took less time
keeps its default."""
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
    """``chosen`` (by operator name; an operator it lacks keeps TVM's default lowering; the model built with it:
    ``library``) with each operator that left its default (``defaults``; None: none to go back to) back on it
    where the default takes less time a model run inside the model. ``build(ops, name)`` builds the model with
    ``ops`` (the rest untuned) into a library; ``profile(libraries, runs)`` is, per library, ms a model run per
    operator name."""
    left = {name: default for name, default in sorted(defaults.items())
            if default is not None and (name not in chosen or not is_default(chosen[name]))}
    if not left:
        return chosen
    builds = {"chosen": library, "defaults": build(list({**chosen, **left}.values()), "in-model-defaults")}
    per_op = dict(zip(builds, profile(list(builds.values()), RUNS)))
    kept = dict(chosen)
    for name, default in left.items():
        chosen_ms, default_ms = (per_op[which].get(name, 0.0) for which in builds)
        if chosen_ms == default_ms == 0.0:  # never called (a reshape the build made a view): nothing to judge
            continue
        faster = default_ms < chosen_ms
        how = "tuned" if name in chosen else "untuned"
        log.info("    %s inside the model: %s %.4g ms a run, default %.4g: it keeps the %s", name, how,
                 chosen_ms, default_ms, "default" if faster else how)
        if faster:
            kept[name] = default
    return kept
