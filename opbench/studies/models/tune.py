"""Tune a whole model: profile its fused operators, tune the key ones, build the model with their best
schedules (a MetaSchedule database) and compare it, verified in fresh processes, with the untuned
build and PyTorch eager. ``tune_model(ModelTuneSpec(ModelSpec("bert-base@tiny"))) -> ModelTuneResult``."""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opbench.engines.loop import enqueue_other_algorithms, run_tuning
from opbench.engines.registry import EngineSpec, create_engine
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, set_tvm_threads
from opbench.hardware.targets import make_target
from opbench.measure.measurer import Measurer
from opbench.measure.models import export_model
from opbench.measure.protocol import ModelInput, RunResult
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions, TrialSpec
from opbench.record import TrialRecord, best_ok, is_ok, tee
from opbench.space import get_template
from opbench.studies.configs import best_config
from opbench.studies.models.in_model import keep_faster_in_model
from opbench.studies.models.profile import TUNED, ModelProfile, OpProfile, profile_model, time_built
from opbench.studies.models.reuse import ReuseKey, TunedCache
from opbench.studies.models.systems import DEFAULTS, EAGER_ROW, UNTUNED, prepare_systems
from opbench.studies.models.tuned import DATABASE_FILES, TunedOp, apply_database, default_op, is_default, prepacked, write_database
from opbench.studies.verify import BEST, Verification, verify_runs
from opbench.tracking import Recorder
from opbench.tracking.mlflow_store import study_dir
from opbench.workloads import Workload, parse_workload
from opbench.workloads.fused import model_name
from opbench.workloads.models import cache
from opbench.workloads.models.extract import FusedOp, key_ops
from opbench.workloads.models.sources import load_model

log = logging.getLogger("opbench")


@dataclass(frozen=True)
class ModelSpec:
    """A model as a source of operators: a name from ``opbench models`` (``@tiny`` for the small variant)
    or an ``.onnx`` file, with its input sizes, and how it is timed (its operators then in the cold cache state)."""

    model: str
    batch: int = 1
    seq_len: int = 128  # token models
    threads: int = 1
    timing: TimingPolicy = field(default_factory=TimingPolicy)


@dataclass(frozen=True)
class ModelTuneSpec:
    model: ModelSpec
    trials_per_op: int = 32
    max_ops: int | None = None  # tune at most this many key operators (largest shares after the defaults first)
    engine: EngineSpec = EngineSpec(seed=0)
    verify_rounds: int = 3  # fresh-process rounds for the tuned model and ``systems`` (0: not verified)
    study: str | None = None  # MLflow experiment (default tune-model-<model>)
    tracking_uri: str | None = None
    systems: tuple[str, ...] = (UNTUNED, EAGER_ROW)  # verified beside the tuned model (studies.models.systems)
    reuse: Path | None = None  # keep the tuning here and reuse what a run with the same key kept (studies.models.reuse)

    def __post_init__(self) -> None:
        if self.trials_per_op < 1:
            raise OpBenchError(f"trials per operator must be >= 1, got {self.trials_per_op}")


@dataclass
class ModelTuneResult:
    rows: list[tuple[Any, ...]]  # per operator: name, kind, share after the defaults, untuned ms, built-with ms,
    # speed-up, how (tuned, default: the template default, untuned: TVM's default lowering)
    metrics: dict[str, float]  # torch_ms, untuned_ms, tuned_ms, speed-ups, max_abs_err, tuned_ops, prepacked_ops
    database: Path  # the MetaSchedule database folder the tuned model was built with
    verification: Verification | None = None
    study: str = ""
    reused: str = ""  # where the operators' records (and MetaSchedule's database) came from, when reused


def profile(spec: ModelSpec, measurer: Measurer, folder: Path, on_op: Callable[[int, FusedOp], None] | None = None,
            untuned: bool = True, kept_in: TunedCache | None = None) -> ModelProfile:
    """Import, fuse and time each fused operator of the model (``on_op`` hears each; their times and memory
    taken from ``kept_in`` when it kept them, kept there when not), and cache them; PyTorch eager and (when
    ``untuned``) the untuned build timed by ``measurer``, that build kept in ``folder``. The workers that time
    them start while the model is imported and fused."""
    source = load_model(spec.model, spec.batch, spec.seq_len)
    set_tvm_threads(spec.threads)
    log.info("%s: importing, fusing and timing each fused operator (%d threads)", source.name, spec.threads)
    kept = kept_in.profile() if kept_in else None
    with ThreadPoolExecutor(1, thread_name_prefix="warm-up") as background:  # docs/measurement.md#zygote
        warming = background.submit(measurer.warm_up, Resources(spec.threads),
                                    models=(spec.model,) if source.has_module else ())
        result = profile_model(source, make_target("llvm", spec.threads), measurer, folder, spec.threads, spec.batch,
                               spec.seq_len, on_op or (lambda n, op: None), untuned, kept, warming)
    if kept_in and kept is None:
        kept_in.save_profile({op.name: OpProfile(op.latency_ms, op.memory) for op in result.ops})
    cache.save(spec.model, spec.batch, spec.seq_len, result.ops, result.funcs)
    return result


def model_measurer(spec: ModelSpec) -> Measurer:
    """A measurer that times the model's operators in the cold cache state they run in inside it (their weights
    from memory), and the model, as ``spec.timing`` says."""
    return Measurer(MeasureOptions(dataclasses.replace(spec.timing, cache_flush=True)))


def tune_model(spec: ModelTuneSpec, on_record: Callable[[TrialRecord], None] | None = None) -> ModelTuneResult:
    """Profile the model, measure every operator's template default, tune the key operators by their time
    after the defaults (in the untuned profile TVM's default lowering of matmuls and convolutions dwarfs
    operators that matter once those are tuned), build the model with the results: rows and metrics."""
    m = spec.model
    study = spec.study or f"tune-model-{m.model}"
    folder = study_dir("tune-model", study, spec.tracking_uri)
    target = make_target("llvm", m.threads)
    with model_measurer(m) as measurer, \
            Recorder(study, spec.tracking_uri, extra={"engine": spec.engine.name}, parent_tags={"model": m.model}) \
            as recorder:
        cache = _cache(spec)
        prof = profile(m, measurer, folder, untuned=UNTUNED in spec.systems, kept_in=cache)  # otherwise never timed
        tunable = [o for o in prof.ops if o.outputs == 1]
        sink = tee(recorder, *filter(None, [on_record]))
        workloads = {op.name: parse_workload(model_name(m.model, op.name, m.batch, m.seq_len)) for op in tunable}
        records, key, after_ms = _operator_records(spec, tunable, workloads, measurer, sink, study, cache)
        total_ms = sum(op.calls * after_ms[op.name] for op in tunable)
        order = sorted(tunable, key=lambda o: -o.calls * after_ms[o.name])
        chosen, defaults = _best_schedules(order, workloads, records)
        build = _ModelBuilder(prof.mod, target, folder)
        library = build(list(chosen.values()))
        kept = keep_faster_in_model(chosen, defaults, library, build, lambda libraries, runs: measurer.profile_models(
            [(lib, prof.inputs) for lib in libraries], Resources(m.threads), runs))
        if kept != chosen:
            library = build(list(kept.values()))
        labels = {name: "tuned" if name in key and kept[name] is chosen.get(name) else "default" for name in kept}
        rows = [_row(op, op.calls * after_ms[op.name] / total_ms, kept.get(op.name), labels.get(op.name, "untuned"))
                for op in order]
        tuned = list(kept.values())
        tuned_ms, err = time_built(measurer, prof.source, library, prof.inputs, m.threads, "the tuned model")
        trials = sum(r["status"] != "invalid_config" for rs in records.values() for r in rs)  # built and timed
        verification = _verify_model(spec, prof, measurer, library, tuned_ms, study, target, folder, trials, cache,
                                     kept_defaults=_all_defaults(tuned, len(tunable)))
        metrics = {"torch_ms": prof.torch_ms, "untuned_ms": prof.model_ms, "tuned_ms": tuned_ms, "trials": trials,
                   "speedup_vs_untuned": prof.model_ms / tuned_ms, "speedup_vs_torch": prof.torch_ms / tuned_ms,
                   "max_abs_err": err, "tuned_ops": len(tuned), "prepacked_ops": len(prepacked(build.last))}
        recorder.log_parent({"model": m.model, "batch": m.batch, "seq_len": m.seq_len, "threads": m.threads,
                                    "trials_per_op": spec.trials_per_op},
                                   {**metrics, **(verification.parent_metrics() if verification else {})},
                                   verification.parent_tags() if verification else {})
        for name in DATABASE_FILES:
            recorder.log_artifact(folder / name, "database")
    return ModelTuneResult(rows, metrics, folder, verification, study, cache.note if cache else "")


def _operator_records(spec: ModelTuneSpec, tunable: list[FusedOp], workloads: dict[str, Workload], measurer: Measurer,
                      sink: Callable[[TrialRecord], None], study: str, cache: TunedCache | None
                      ) -> tuple[dict[str, list[TrialRecord]], set[str], dict[str, float]]:
    """Each operator's records (its template default first, then a key operator's trials), the key operators
    and each one's time after the defaults: measured, and kept in ``cache``, or what ``cache`` kept."""
    resources = Resources(spec.model.threads)
    kept = cache.records() if cache else None
    if cache is not None and kept is not None:
        log.info("--- the operators' records a run with the same key kept: %s", cache.folder)
        records = {op.name: kept.get(op.name, []) for op in tunable}
    else:
        log.info("--- the template default of each of %d operators (they rank the key operators)", len(tunable))
        records = {op.name: measurer.measure_batch([TrialSpec(workloads[op.name], {}, resources)], sink)
                   for op in tunable}
    after_ms = {op.name: min(op.latency_ms, _best_ms(records[op.name][:1])) for op in tunable}  # the default's
    total_ms = sum(op.calls * after_ms[op.name] for op in tunable)
    key = {o.name for o in key_ops(tunable, lambda o: after_ms[o.name])[:spec.max_ops]}
    if kept is not None:
        return records, key, after_ms
    for op in sorted((o for o in tunable if o.name in key), key=lambda o: -o.calls * after_ms[o.name]):
        workload = workloads[op.name]
        log.info("--- %s: %.1f%% of the model after the defaults, %d trials", workload.name,
                 100 * op.calls * after_ms[op.name] / total_ms, spec.trials_per_op)
        template = get_template(workload)  # its default was measured above: the engine goes on from there,
        engine = create_engine(spec.engine, template.search_space(workload), workload, template, resources,
                               f"{study}-{op.name}")
        enqueue_other_algorithms(engine, workload, template, resources)  # ... trying first its other algorithms
        records[op.name] += run_tuning(engine, workload, spec.trials_per_op, measurer, sink, resources)
        engine.close()
    if cache is not None:
        cache.save_records(records)
    return records, key, after_ms


def _best_schedules(ops: list[FusedOp], workloads: dict[str, Workload], records: dict[str, list[TrialRecord]]
                    ) -> tuple[dict[str, TunedOp], dict[str, TunedOp | None]]:
    """Each operator's fastest schedule measured alone, where it beat TVM's default lowering alone, and its
    template default's (None where that failed), by operator name: the model decides between them
    (:func:`~opbench.studies.models.in_model.keep_faster_in_model`)."""
    chosen: dict[str, TunedOp] = {}
    defaults: dict[str, TunedOp | None] = {}
    for op in ops:
        workload = workloads[op.name]
        template = get_template(workload)
        first = records[op.name][0]  # the template default's
        defaults[op.name] = default_op(workload, first["latency_ms"]) if is_ok(first) else None
        config, best = best_config(records[op.name], workload.name), best_ok(records[op.name])
        if config is None or best is None or best["latency_ms"] >= op.latency_ms:
            log.info("    nothing faster than TVM's default lowering alone for %s", op.name)
            continue
        chosen[op.name] = TunedOp(workload, template, template.validate(config, workload), best["latency_ms"])
    return chosen, defaults


def _row(op: FusedOp, share: float, built: TunedOp | None, how: str) -> tuple:
    """An operator's row: name, kind, share, untuned ms, ms with the schedule it is built with, speed-up, how."""
    ms = built.latency_ms if built is not None else op.latency_ms
    return (op.name, op.kind, share, op.latency_ms, ms, op.latency_ms / ms, how)


class _ModelBuilder:
    """``build(ops)``: the model built with ``ops``' schedules (the rest untuned) as ``folder``'s tuned
    library, from the database it leaves in ``folder``; ``build(ops, name)``: an alternative build, as
    ``folder/name.so`` from a database in ``folder/name``. ``last`` is the module built last."""

    def __init__(self, mod: Any, target: Any, folder: Path) -> None:
        self.mod, self.target, self.folder = mod, target, folder
        self.last: Any = None

    def __call__(self, ops: list[TunedOp], name: str | None = None) -> Path:
        database = write_database(self.folder / name if name else self.folder, ops, self.target)
        self.last = apply_database(self.mod, database, self.target)
        return export_model(self.last, self.target, self.folder / (f"{name}.so" if name else TUNED))


def _cache(spec: ModelTuneSpec) -> TunedCache | None:
    """Where ``spec``'s tuning is kept and found again (None without ``reuse``)."""
    if spec.reuse is None:
        return None
    m, engine = spec.model, spec.engine
    return TunedCache(spec.reuse, ReuseKey.here(m.model, m.batch, m.seq_len, m.threads, spec.trials_per_op, spec.max_ops,
                                                f"{engine.label}, seed {engine.seed}"))


def _best_ms(records: list[TrialRecord]) -> float:
    best = best_ok(records)
    return best["latency_ms"] if best else math.inf


def _all_defaults(tuned: list[TunedOp], tunable: int) -> bool:
    """Whether the tuned build is the template defaults' build: every operator kept its default."""
    return len(tuned) == tunable and all(map(is_default, tuned))


def _verify_model(spec: ModelTuneSpec, prof: ModelProfile, measurer: Measurer, tuned: Path, tuned_ms: float,
                  study: str, target: Any, folder: Path, trials: int, cache: TunedCache | None, kept_defaults: bool
                  ) -> Verification | None:
    """The tuned build and each of ``spec.systems`` (MetaSchedule with the tuned model's ``trials``), each
    timed in fresh processes, ``verify_rounds`` placements each (None with no rounds); a system that
    could not be prepared is a row saying why. A tuning that ``kept_defaults`` built the template defaults'
    model: it is timed once a round for both."""
    if spec.verify_rounds < 1:
        return None
    m = spec.model
    twins = {DEFAULTS: BEST} if kept_defaults and DEFAULTS in spec.systems else {}  # its build is the tuned one
    prepared = prepare_systems(tuple(s for s in spec.systems if s not in twins), prof, m.model, m.batch, m.seq_len,
                               m.threads, target, folder, trials, cache)
    models = {BEST: ModelInput(m.model, library=str(tuned), inputs=str(prof.inputs), resources=Resources(m.threads)),
              **prepared.runs}
    log.info("verifying: %s in fresh processes, %d rounds", ", ".join(models), spec.verify_rounds)
    runs: dict[str, RunResult | str] = {**prepared.failed, **dict(zip(models, measurer.time_models_fresh(
        list(models.values()), placements=spec.verify_rounds)))}
    measured = {BEST: tuned_ms, UNTUNED: prof.model_ms, EAGER_ROW: prof.torch_ms}
    names = [BEST, *(s for s in spec.systems if s in models or s in twins or s in prepared.failed)]
    verification = verify_runs(names, runs, measured, study, spec.verify_rounds, twins)
    verification.notes.update(prepared.notes)
    if cache is not None and cache.note:
        verification.notes[BEST] = cache.note
    return verification


def model_speedups(result: ModelTuneResult) -> tuple[TrialRecord, dict[str, TrialRecord]]:
    """The tuned model and what it is compared with as records for a speed-up table: untuned and PyTorch as
    the study measured them, every other verified system by its fresh-process times alone."""
    m = result.metrics
    refs = {"untuned": TrialRecord(latency_ms=m["untuned_ms"])}
    if not math.isnan(m["torch_ms"]):
        refs["torch"] = TrialRecord(latency_ms=m["torch_ms"])
    for name in result.verification.schedules if result.verification else ():
        refs.setdefault(name, TrialRecord(status="verified only", latency_ms=math.nan))
    refs.pop(BEST, None)
    return TrialRecord(latency_ms=m["tuned_ms"]), refs
