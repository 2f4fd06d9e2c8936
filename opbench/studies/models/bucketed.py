"""``tune-model`` at several sizes of a model's dynamic dimension (a token model's sequence length, another's
batch): the model imported once with it symbolic, tuned and built at each of its buckets (each bucket a whole
``tune_model``, verified against PyTorch eager at that size), then run through the dispatcher
(:class:`~opbench.workloads.models.dynamic.BucketedModel`) at sizes between the buckets: each output checked
against eager at that size, and each timed on its bucket, padded, beside eager at that size, in fresh
processes."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.measure.models import save_inputs
from opbench.measure.protocol import ModelInput, RunResult
from opbench.measure.worker._common import outputs_agree
from opbench.record import TrialRecord
from opbench.studies.models.profile import TUNED
from opbench.studies.models.systems import EAGER_ROW
from opbench.studies.models.tune import ModelTuneResult, ModelTuneSpec, model_measurer, tune_model
from opbench.studies.verify import BEST, Verification, verify_runs
from opbench.tracking import Recorder
from opbench.tracking.mlflow_store import study_dir
from opbench.workloads.models.dynamic import BucketedModel, Dispatched, padded
from opbench.workloads.models.sources import DynamicAxis, ModelSource, load_model

log = logging.getLogger("opbench")


@dataclass(frozen=True)
class BetweenRun:
    """A size between the buckets, run by the dispatcher: which bucket ran it, its output's max |error|
    against eager at that size, and (with verify rounds) its padded run and eager's, in fresh processes."""

    dispatched: Dispatched
    max_abs_err: float
    verification: Verification | None


@dataclass
class BucketedResult:
    buckets: dict[int, ModelTuneResult]  # by bucket size
    between: list[BetweenRun]


def default_between(buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The size midway between the first two buckets (none with one bucket, or two adjacent ones)."""
    if len(buckets) < 2 or buckets[1] - buckets[0] < 2:
        return ()
    return ((buckets[0] + buckets[1]) // 2,)


def dynamic_axis(model: str) -> DynamicAxis:
    """The named model's dynamic dimension; an error for a model without one."""
    return load_model(model).dynamic()


def _at(spec: ModelTuneSpec, axis: DynamicAxis, size: int) -> ModelTuneSpec:
    """``spec`` with its model at ``size`` along ``axis``."""
    m = spec.model
    return replace(spec, model=replace(m, seq_len=size) if axis.name == "seq_len" else replace(m, batch=size))


def _source(spec: ModelTuneSpec, axis: DynamicAxis, size: int) -> ModelSource:
    """``spec``'s model at ``size`` along ``axis``."""
    at = _at(spec, axis, size).model
    return load_model(at.model, at.batch, at.seq_len)


def _checked_sources(spec: ModelTuneSpec, axis: DynamicAxis, sizes: tuple[int, ...]) -> dict[int, ModelSource]:
    """Each size's source, the model known to run at each (a tiny model cuts its sequences short)."""
    sources = {n: _source(spec, axis, n) for n in sizes}
    for n, source in sources.items():
        if source.dynamic_size() != n:
            raise OpBenchError(f"model '{spec.model.model}' runs at most {source.dynamic_size()} tokens, so not at "
                               f"length {n}")
    return sources


def tune_bucketed(spec: ModelTuneSpec, axis: DynamicAxis, buckets: tuple[int, ...], between: tuple[int, ...],
                  on_record: Callable[[TrialRecord], None] | None = None) -> BucketedResult:
    """``spec``'s model tuned at each of ``buckets`` along ``axis`` (the size ``spec.model`` names there is not
    read), then run at each of ``between`` through the dispatcher."""
    m = spec.model
    if any(n >= buckets[-1] or n in buckets for n in between):
        raise OpBenchError(f"sizes to run between the buckets must be below the largest bucket "
                           f"({buckets[-1]}) and not buckets, got {', '.join(map(str, between))}")
    sources = _checked_sources(spec, axis, (*buckets, *between))
    study = spec.study or f"tune-model-{m.model}"
    suffix = axis.tag
    results = {}
    for bucket in buckets:
        log.info("=== bucket %d of %s: %s %d", buckets.index(bucket) + 1, m.model, axis.noun, bucket)
        results[bucket] = tune_model(replace(_at(spec, axis, bucket), study=f"{study}-{suffix}{bucket}"), on_record)
    dispatcher = BucketedModel({b: r.database / TUNED for b, r in results.items()}, axis)
    folder = study_dir("tune-model", study, spec.tracking_uri)
    runs = [_run_between(spec, sources[n], dispatcher, folder, study) for n in between]
    params = {"model": m.model, "batch": m.batch, "seq_len": m.seq_len, axis.name: "dynamic",
              "buckets": ",".join(map(str, buckets)), "between": ",".join(map(str, between)), "threads": m.threads}
    with Recorder(study, spec.tracking_uri, parent_tags={"model": m.model}) as recorder:
        recorder.log_parent(params, {f"{key}_{suffix}{run.dispatched.size}": value for run in runs
                                     for key, value in _between_metrics(run).items()})
    return BucketedResult(results, runs)


def _run_between(spec: ModelTuneSpec, source: ModelSource, dispatcher: BucketedModel, folder: Path, study: str
                 ) -> BetweenRun:
    """``source``'s size through the dispatcher: checked against eager at that size, then its bucket's
    library on the padded inputs and eager at that size timed in fresh processes."""
    inputs = source.numpy_inputs()
    run = dispatcher(inputs)
    expected = source.reference()[0]
    err = float(np.max(np.abs(run.output - expected)))
    log.info("%s; output against eager at that size: max |err| %.3g", run.describe(), err)
    if not outputs_agree(run.output, expected):
        raise OpBenchError(f"{source.name}: {run.describe()}, and its output differs from eager's at that size "
                           f"(max |err| {err:.3g})")
    if spec.verify_rounds < 1:
        return BetweenRun(run, err, None)
    m, suffix = spec.model, dispatcher.axis.tag
    pad = padded(inputs, dispatcher.axis, run.bucket)
    # what the padded run is checked against in the worker: the reference on the same padded inputs
    saved = save_inputs(pad, folder / f"inputs-{suffix}{run.size}-on-{suffix}{run.bucket}.npz",
                        source.reference(pad)[0])
    resources = Resources(m.threads)
    models = {BEST: ModelInput(m.model, library=str(dispatcher.libraries[run.bucket]), inputs=str(saved),
                               resources=resources)}
    if source.has_module:  # an ONNX file's padded run is timed alone: no eager to compare with
        at = _at(spec, dispatcher.axis, run.size).model
        models[EAGER_ROW] = ModelInput(at.model, at.batch, at.seq_len, resources=resources)
    with model_measurer(m) as measurer:
        timed: list[RunResult] = measurer.time_models_fresh(list(models.values()), placements=spec.verify_rounds)
    verification = verify_runs(list(models), dict(zip(models, timed)), {}, f"{study}-{suffix}{run.size}",
                               spec.verify_rounds)
    return BetweenRun(run, err, verification)


def _between_metrics(run: BetweenRun) -> dict[str, float]:
    ratio = run.verification.ratio(BEST, EAGER_ROW) if run.verification else None
    return {"bucket": run.dispatched.bucket, "max_abs_err": run.max_abs_err,
            "tuned_vs_eager": ratio.median if ratio else math.nan}

