"""``tune-model`` at several sequence lengths: a token model imported once with its length symbolic, tuned and
built at each of its buckets (each bucket a whole ``tune_model``, verified against PyTorch eager at that length),
then run through the dispatcher (:class:`~opbench.workloads.models.dynamic.BucketedModel`) at lengths between
the buckets: each output checked against eager at that length, and each timed on its bucket, padded, beside eager
at that length, in fresh processes."""
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
from opbench.measure.worker._common import MODEL_TOLERANCE
from opbench.record import TrialRecord
from opbench.studies.models.profile import TUNED
from opbench.studies.models.systems import EAGER_ROW
from opbench.studies.models.tune import ModelTuneResult, ModelTuneSpec, model_measurer, tune_model
from opbench.studies.verify import BEST, Verification, verify_runs
from opbench.tracking import Recorder
from opbench.tracking.mlflow_store import study_dir
from opbench.workloads.models.dynamic import BucketedModel, Dispatched, padded, seq_len
from opbench.workloads.models.sources import ModelSource, load_model

log = logging.getLogger("opbench")


@dataclass(frozen=True)
class BetweenRun:
    """A length between the buckets, run by the dispatcher: which bucket ran it, its output's max |error|
    against eager at that length, and (with verify rounds) its padded run and eager's, in fresh processes."""

    dispatched: Dispatched
    max_abs_err: float
    verification: Verification | None


@dataclass
class BucketedResult:
    buckets: dict[int, ModelTuneResult]  # by bucket length
    between: list[BetweenRun]


def default_between(buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The length midway between the first two buckets (none with one bucket, or two adjacent ones)."""
    if len(buckets) < 2 or buckets[1] - buckets[0] < 2:
        return ()
    return ((buckets[0] + buckets[1]) // 2,)


def _checked_sources(model: str, batch: int, lengths: tuple[int, ...]) -> dict[int, ModelSource]:
    """Each length's source, the model known to have a sequence length that runs at each (a tiny model cuts
    its sequences short)."""
    sources = {n: load_model(model, batch, n) for n in lengths}
    for n, source in sources.items():
        if seq_len(source) != n:
            raise OpBenchError(f"model '{model}' runs at most {seq_len(source)} tokens, so not at length {n}")
    return sources


def tune_bucketed(spec: ModelTuneSpec, buckets: tuple[int, ...], between: tuple[int, ...],
                  on_record: Callable[[TrialRecord], None] | None = None) -> BucketedResult:
    """``spec``'s model tuned at each of ``buckets`` (``spec.model.seq_len`` is not read), then run at each of
    ``between`` through the dispatcher."""
    m = spec.model
    if any(n >= buckets[-1] or n in buckets for n in between):
        raise OpBenchError(f"lengths to run between the buckets must be shorter than the largest bucket "
                           f"({buckets[-1]}) and not buckets, got {', '.join(map(str, between))}")
    sources = _checked_sources(m.model, m.batch, (*buckets, *between))
    study = spec.study or f"tune-model-{m.model}"
    results = {}
    for bucket in buckets:
        log.info("=== bucket %d of %s: sequence length %d", buckets.index(bucket) + 1, m.model, bucket)
        results[bucket] = tune_model(replace(spec, model=replace(m, seq_len=bucket), study=f"{study}-s{bucket}"),
                                     on_record)
    dispatcher = BucketedModel({b: r.database / TUNED for b, r in results.items()}, sources[buckets[0]].sequence_axis())
    folder = study_dir("tune-model", study, spec.tracking_uri)
    runs = [_run_between(spec, sources[n], dispatcher, folder, study) for n in between]
    with Recorder(study, spec.tracking_uri, parent_tags={"model": m.model}) as recorder:
        recorder.log_parent({"model": m.model, "batch": m.batch, "buckets": ",".join(map(str, buckets)),
                             "between": ",".join(map(str, between)), "threads": m.threads},
                            {f"{key}_s{run.dispatched.length}": value for run in runs
                             for key, value in _between_metrics(run).items()})
    return BucketedResult(results, runs)


def _run_between(spec: ModelTuneSpec, source: ModelSource, dispatcher: BucketedModel, folder: Path, study: str
                 ) -> BetweenRun:
    """``source``'s length through the dispatcher: checked against eager at that length, then its bucket's
    library on the padded inputs and eager at that length timed in fresh processes."""
    inputs = source.numpy_inputs()
    run = dispatcher(inputs)
    expected = source.reference()[0]
    err = float(np.max(np.abs(run.output - expected)))
    log.info("%s; output against eager at that length: max |err| %.3g", run.describe(), err)
    if not np.allclose(run.output, expected, rtol=MODEL_TOLERANCE, atol=MODEL_TOLERANCE):
        raise OpBenchError(f"{source.name}: {run.describe()}, and its output differs from eager's at that length "
                           f"(max |err| {err:.3g})")
    if spec.verify_rounds < 1:
        return BetweenRun(run, err, None)
    m = spec.model
    pad = padded(inputs, dispatcher.axis, run.bucket)
    # what the padded run is checked against in the worker: the reference on the same padded inputs
    saved = save_inputs(pad, folder / f"inputs-s{run.length}-on-s{run.bucket}.npz", source.reference(pad)[0])
    resources = Resources(m.threads)
    models = {BEST: ModelInput(m.model, library=str(dispatcher.libraries[run.bucket]), inputs=str(saved),
                               resources=resources)}
    if source.has_module:  # an ONNX file's padded run is timed alone: no eager to compare with
        models[EAGER_ROW] = ModelInput(m.model, m.batch, run.length, resources=resources)
    with model_measurer(m) as measurer:
        timed: list[RunResult] = measurer.time_models_fresh(list(models.values()), placements=spec.verify_rounds)
    verification = verify_runs(list(models), dict(zip(models, timed)), {}, f"{study}-s{run.length}",
                               spec.verify_rounds)
    return BetweenRun(run, err, verification)


def _between_metrics(run: BetweenRun) -> dict[str, float]:
    ratio = run.verification.ratio(BEST, EAGER_ROW) if run.verification else None
    return {"bucket": run.dispatched.bucket, "max_abs_err": run.max_abs_err,
            "tuned_vs_eager": ratio.median if ratio else math.nan}

