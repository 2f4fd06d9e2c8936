"""A tuning study: ``run_study(TuneSpec(...)) -> StudyResult``, what ``opbench tune`` runs.

The references, the engine's trials (in this process, in K worker processes sharing an Optuna
storage, or MetaSchedule's own loop), a fresh-process verification of the best, plots and the parent
run's summary. Progress goes to ``on_record`` (each record as it is stored) and to the ``opbench``
logger; nothing is printed.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from opbench.engines._base import Engine, Space
from opbench.engines.loop import CORES_KNOB, enqueue_default, run_tuning
from opbench.engines.optuna.engine import OptunaEngine
from opbench.engines.registry import LOOP_ENGINES, EngineSpec, create_engine, create_loop_engine
from opbench.exceptions import OpBenchError, StudyInterrupted
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources, parse_cores
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.record import KNOB_PREFIX, TrialRecord, best_ok, ok_records, pareto_front, speedup, tee
from opbench.report.plots import tradeoff, tuning_curve
from opbench.report.study_records import TEMPLATE_DEFAULT, default_trial, references
from opbench.space import get_template
from opbench.studies.invocation import engine_trials, invocation_records, joined_hosts_records, told_from_logs
from opbench.studies.references import library_references, measure_references
from opbench.studies.shared import WorkerSpec, joined_spec, publish, published_parent
from opbench.studies.verify import KEPT_BUILDS, Spread, Verification, remeasure, rounds_for, spec_of, verified_best, verify
from opbench.tracking import Recorder
from opbench.tracking.mlflow_store import study_dir
from opbench.workloads import Workload, parse_workload

log = logging.getLogger("opbench")
OnRecord = Callable[[TrialRecord], None]


@dataclass(frozen=True)
class TuneSpec:
    """Everything a study needs; ``TuneSpec("matmul-512", trials=32)`` is a complete one."""

    workload: str  # OP:key=value,... or a preset
    trials: int = 64
    engine: EngineSpec = EngineSpec()
    resources: Resources = Resources()
    template: str | None = None  # None: the op's default (opbench.space.get_template)
    study: str | None = None  # MLflow experiment (default tune-<workload>-<engine>)
    search_threads: tuple[int, ...] = ()  # also search the thread count among these
    search_cores: tuple[str, ...] = ()  # also search the core set among these ("0", "0,1", ...)
    batch: int = 1  # configs proposed, built in parallel, then timed, per step
    workers: int = 1  # Optuna worker processes sharing the study's storage
    resume: bool = False  # continue an Optuna study instead of starting it afresh
    references: bool = True  # TE default, template default, torch and numpy timed first
    verify_rounds: int | None = None  # fresh-process rounds re-measuring the best and the references (0: not
    # verified; None: by the budget, opbench.studies.verify.rounds_for)
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    tracking_uri: str | None = None  # MLflow (default: sqlite store in mlflow/)
    log: str | None = None  # also append records to this JSON-lines file

    def __post_init__(self) -> None:
        if self.trials < 0:
            raise OpBenchError(f"trials (--trials) must be >= 0, got {self.trials}")
        if self.workers < 1:
            raise OpBenchError(f"workers (--workers) must be >= 1, got {self.workers}")
        if self.workers > 1 and self.engine.name != "optuna":
            raise OpBenchError("several workers (--workers) share one Optuna storage: they need the optuna engine")
        if self.resume and self.engine.name != "optuna":
            raise OpBenchError(f"resume (--resume) continues an Optuna study; engine '{self.engine.name}' keeps no "
                               "resumable state")
        if "threads" in self.engine.objectives and not self.search_threads:
            raise OpBenchError("a threads objective needs --search-threads (search_threads): a thread count to trade off")
        if self.search_cores and self.engine.name == "model":
            raise OpBenchError("searching core sets (--search-cores) is not supported by the model engine "
                               "(its features have no core set)")
        for core_set in self.search_cores:
            parse_cores(core_set)  # a malformed set fails here, naming it

    @property
    def study_name(self) -> str:
        return self.study or f"tune-{parse_workload(self.workload).name}-{self.engine.label}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> TuneSpec:
        raw = json.loads(text)
        res = raw.pop("resources")
        res["cores"] = tuple(res["cores"]) if res["cores"] is not None else None
        engine = raw.pop("engine")
        engine["objectives"] = tuple(engine["objectives"])
        measure = raw.pop("measure")
        measure["lock_path"] = Path(measure["lock_path"])
        measure["timing"] = TimingPolicy(**measure["timing"])
        return cls(**{**raw, "search_threads": tuple(raw["search_threads"]), "search_cores": tuple(raw["search_cores"])},
                   engine=EngineSpec(**engine), resources=Resources(**res), measure=MeasureOptions(**measure))


@dataclass
class StudyResult:
    """What a study found: its trials, references, best and (when verified) the fresh-process spreads."""

    study: str
    tracking_uri: str
    records: list[TrialRecord] = field(default_factory=list)  # the engine's trials of this invocation (resumed ones too)
    references: dict[str, TrialRecord] = field(default_factory=dict)
    verification: Verification | None = None
    objectives: tuple[str, ...] = ("latency",)  # what the engine minimised (more than one: a Pareto front)
    pareto: list[TrialRecord] = field(default_factory=list)  # multi-objective studies: the front, by the second objective
    pareto_verified: dict[str, Spread] = field(default_factory=dict)  # the front's latencies in fresh processes, by trial id
    rejected: int = 0  # invalid configs turned away before measuring
    plots: dict[str, Path] = field(default_factory=dict)

    @property
    def best(self) -> TrialRecord | None:
        """The verified best (the fastest of the study's contenders in a fresh process: a trial, or the
        template_default reference) when verified, else the fastest trial the study measured."""
        return verified_best([*self.records, *self.references.values()], self.verification) or best_ok(self.records)


def search_space(spec: TuneSpec, workload: Workload) -> Space:
    """The template's per-workload space, with thread counts and core sets when those are searched."""
    space = get_template(workload, spec.template, spec.resources.target).search_space(workload)
    if spec.search_threads:
        space["threads"] = {"_type": "choice", "_value": list(spec.search_threads)}
    if spec.search_cores:
        space[CORES_KNOB] = {"_type": "choice", "_value": list(spec.search_cores)}
    return space


def make_engine(spec: TuneSpec, workload: Workload, study: str, resume: bool, budget: int | None = None) -> Engine:
    template = get_template(workload, spec.template, spec.resources.target)
    return create_engine(spec.engine, search_space(spec, workload), workload, template, spec.resources, study, resume,
                         budget)


def spawn_workers(spec: TuneSpec, todo: int, parent_run_id: str) -> None:
    """Worker processes (at most ``spec.workers``, one per trial to do) that take the already-created
    Optuna study's trials until its budget is spent; each ends when this process does."""
    procs = []
    for i in range(min(spec.workers, todo)):
        seed = None if spec.engine.seed is None else spec.engine.seed + 1 + i  # same seeds: same proposals
        worker = dataclasses.replace(spec, workers=1, engine=dataclasses.replace(spec.engine, seed=seed))
        # the spec goes through a pipe, not argv: its storage URL may hold a password (ps shows argv to all users)
        proc = subprocess.Popen([sys.executable, "-m", "opbench.studies.tune", parent_run_id, str(i), str(os.getpid())],
                                stdin=subprocess.PIPE, text=True)
        assert proc.stdin is not None
        proc.stdin.write(worker.to_json())
        proc.stdin.close()
        procs.append(proc)
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        raise StudyInterrupted(f"{len(failed)} of {len(procs)} workers failed; resume the study (--resume)")


def run_study(spec: TuneSpec, on_record: OnRecord | None = None) -> StudyResult:
    """The whole study: references, tuning, verification, plots and the parent run's summary.

    Each invocation is one MLflow parent run; ``resume`` continues the one that last published the
    Optuna study: its records (replayed from the write-ahead log where MLflow lacks them) settle the
    trials a kill left running, and its references are kept."""
    workload = parse_workload(spec.workload)
    if spec.resources.remote:  # a batch as large as the devices held, so each step keeps them all busy
        spec = dataclasses.replace(spec, batch=max(spec.batch, spec.measure.remote_workers))
    # builds of one batch run in parallel, two at most (this host has few cores for compiling beside timing)
    measure = dataclasses.replace(spec.measure, build_workers=max(spec.measure.build_workers, min(spec.batch, 2)))
    # The budget is the study's, whoever measures: worker hosts (opbench worker) may take trials of it too.
    engine = None if spec.engine.name in LOOP_ENGINES else make_engine(
        spec, workload, spec.study_name, spec.resume, budget=spec.trials)
    resumed = published_parent(engine.study, engine.storage_url) if spec.resume and isinstance(engine, OptunaEngine) \
        else None
    with Measurer(measure) as measurer, ThreadPoolExecutor(1, thread_name_prefix="warm-up") as background:
        # A new study's workers start while the MLflow store is set up (docs/measurement.md#zygote).
        libraries = None if spec.resume else _timed_libraries(spec, workload, False, 0)
        warming = None if libraries is None else background.submit(measurer.warm_up, spec.resources, libraries)
        with Recorder(spec.study_name, spec.tracking_uri, spec.log, extra={"engine": spec.engine.label},
                      parent_run_id=resumed, reopen=True, background_lock=HostLock(measure.lock_path)) as recorder, \
                measurer.reusing_builds(fastest=KEPT_BUILDS):  # what the verification times, built once
            result = _study(spec, workload, engine, measurer, recorder, on_record, resumed, warming)
    if engine:
        engine.close()
    return result


def _study(spec: TuneSpec, workload: Workload, engine: Engine | None, measurer: Measurer, recorder: Recorder,
           on_record: OnRecord | None, resumed: str | None, warming: Future[None] | None) -> StudyResult:
    """:func:`run_study` once its measurer, engine and parent run are set up (``warming``: their warm-up, begun)."""
    earlier = invocation_records(recorder) if resumed else []
    earlier_trials = engine_trials(earlier)
    if engine:
        engine.recover(earlier_trials)
        told_from_logs(engine, recorder)
    done = engine.done if engine else 0
    log.info("tuning %s with %s: %d trials (%d already done), %d thread(s), %d worker(s); study '%s'",
             workload.name, spec.engine.label, spec.trials, done, spec.resources.threads, spec.workers, recorder.study)
    if isinstance(engine, OptunaEngine):  # without the storage URL: a joining host gives its own
        published = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, storage=None))
        publish(engine.study, engine.storage_url, published.to_json(), recorder.parent_run_id)
    refs = references(earlier)  # a resumed invocation keeps its own
    if warming is not None:
        warming.result()
    elif (libraries := _timed_libraries(spec, workload, bool(refs), done)) is not None:
        measurer.warm_up(spec.resources, libraries)
    sink = tee(recorder, *filter(None, [on_record]))
    if spec.references and not refs:  # an ask/tell engine's first trial is the template default
        refs = measure_references(measurer, workload, spec.resources, sink, spec.template,
                                  template_default=engine is None)
    records = _tune(spec, engine, workload, spec.trials - done, measurer, sink, recorder, list(earlier_trials.values()))
    trials = sorted([*earlier_trials.values(), *records], key=lambda r: r.get("finished_at", 0.0))
    if spec.references and TEMPLATE_DEFAULT not in refs and (default := default_trial(trials)) is not None:
        refs[TEMPLATE_DEFAULT] = default  # the loop's first trial
    result = StudyResult(recorder.study, recorder.uri, trials, refs, objectives=spec.engine.objectives,
                         rejected=engine.rejected if engine else 0)
    result.verification = _verify(spec, measurer, [*refs.values(), *result.records], recorder)
    _summarize(result, engine, f"{workload.name}: {spec.engine.label}", recorder)
    result.pareto_verified = _verify_front(spec, measurer, result.pareto, recorder)
    return result


def _timed_libraries(spec: TuneSpec, workload: Workload, refs_known: bool, done: int) -> tuple[str, ...] | None:
    """The library baselines this process times, whose zygotes start with its kernel worker; None when it times
    nothing (the references known, and worker processes or none left take the trials)."""
    refs = spec.references and not refs_known
    if not refs and (spec.workers > 1 or spec.trials <= done):
        return None
    return tuple(library_references(workload, spec.resources)) if refs else ()


def join_study(spec: TuneSpec, parent_run_id: str, worker_index: int = 0, on_record: OnRecord | None = None,
               background: bool = False) -> None:
    """A worker of a study: trials of the existing Optuna study until it has ``spec.trials``, whoever
    measured them. A worker on another host (not ``background``) writes each record to MLflow before
    telling Optuna, so the study's own host finds every trial Optuna counts; ``tune --workers``'s own
    processes write in the background (their host's write-ahead log holds what MLflow may lack)."""
    workload = parse_workload(spec.workload)
    engine = make_engine(spec, workload, spec.study_name, True, budget=spec.trials)
    writer_lock = HostLock(spec.measure.lock_path) if background else None
    with Measurer(spec.measure) as measurer, \
            Recorder(spec.study_name, spec.tracking_uri, spec.log, extra={"engine": spec.engine.label},
                     parent_run_id=parent_run_id, background_lock=writer_lock) as recorder:
        engine.recover(engine_trials(recorder.recovered))  # a killed worker's trials its log holds: told, not redone
        told_from_logs(engine, recorder)
        measurer.warm_up(spec.resources)

        def sink(record: TrialRecord) -> None:
            recorder(record)
            if on_record:
                on_record(record)
            log.info("[worker %d] %s %s ms", worker_index, record["status"], record.get("latency_ms"))

        run_tuning(engine, workload, spec.trials, measurer, sink, spec.resources, spec.template, spec.batch)
    engine.close()


def _tune(spec: TuneSpec, engine: Engine | None, workload: Workload, todo: int, measurer: Measurer, sink: OnRecord,
          recorder: Recorder, earlier: list[TrialRecord]) -> list[TrialRecord]:
    """The invocation's trials: by a loop engine (MetaSchedule), by ``--workers`` processes, or here (with
    whatever other hosts measured meanwhile)."""
    if engine is None:
        owner = create_loop_engine(spec.engine, study_dir(spec.engine.name, recorder.study, spec.tracking_uri))
        return owner.run(workload, todo, measurer, sink, spec.resources, on_artifact=lambda record, path:
                         recorder.log_artifact(path, owner.name, record["trial_id"] if record else None))
    if spec.workers > 1:
        if not spec.resume:
            enqueue_default(engine, workload, get_template(workload, spec.template, spec.resources.target), spec.resources)
        spawn_workers(spec, todo, recorder.parent_run_id)
        return joined_hosts_records(recorder, earlier)
    records = run_tuning(engine, workload, todo, measurer, sink, spec.resources, spec.template, spec.batch,
                         fresh=not spec.resume)
    if engine.done > len(earlier) + len(records):  # other hosts (opbench worker) measured some
        records += joined_hosts_records(recorder, [*earlier, *records])
    return records


def run_worker(worker: WorkerSpec, on_record: OnRecord | None = None) -> None:
    """``opbench worker``: this host takes trials of a running study until its budget is spent."""
    spec_json, parent_run_id = joined_spec(worker)
    join_study(TuneSpec.from_json(spec_json), parent_run_id, on_record=on_record)


def _verify(spec: TuneSpec, measurer: Measurer, records: list[TrialRecord], recorder: Recorder) -> Verification | None:
    """The best and the references re-measured in fresh processes, on the parent run; None ("not verified") if skipped."""
    rounds = _verify_rounds(spec)
    if rounds < 1 or not any(not r.get("reference") for r in ok_records(records)):
        return None
    log.info("verifying: best and references in fresh processes, %d rounds", rounds)
    verification = verify(measurer, records, recorder.study, rounds, recorder)
    recorder.log_parent(metrics=verification.parent_metrics(), tags=verification.parent_tags())
    return verification


def _verify_front(spec: TuneSpec, measurer: Measurer, front: list[TrialRecord], recorder: Recorder) -> dict[str, Spread]:
    """The Pareto front's latencies re-measured in fresh processes, as any speed-up is, by trial id (the other
    objective, threads, bytes or joules, is not a timing); empty when the study is not verified."""
    rounds = _verify_rounds(spec)
    if rounds < 1 or not front:
        return {}
    specs = {str(r["trial_id"]): spec_of(r) for r in front}
    timed = remeasure(measurer, specs, {str(r["trial_id"]): float(r["latency_ms"]) for r in front}, rounds, recorder)
    return {name: verified.latency for name, verified in timed.items() if verified.latency is not None}


def _verify_rounds(spec: TuneSpec) -> int:
    """The fresh-process rounds that verify this study (0: none; remote devices are never verified)."""
    return 0 if spec.resources.remote else rounds_for(spec.trials) if spec.verify_rounds is None else spec.verify_rounds


def _summarize(result: StudyResult, engine: Engine | None, title: str, recorder: Recorder) -> None:
    """Plots as files and artifacts, the best result and the Pareto front on the parent run."""
    plots = recorder.folder("plots")
    result.plots["tuning_curve"] = tuning_curve(result.records, result.references, title, plots / "tuning_curve.png")
    recorder.log_artifact(result.plots["tuning_curve"], "plots")
    best = result.best
    if best:
        recorder.log_parent(
            params={"best." + k: v for k, v in best.items() if k.startswith(KNOB_PREFIX)},
            metrics={"best_latency_ms": best["latency_ms"], "best_gflops": best["gflops"],
                     **{f"tuned_speedup_vs_{n}": speedup(r, best) for n, r in result.references.items()}})
    if engine is not None and len(engine.objectives) > 1:
        result.pareto = pareto_front(result.records, engine.objectives)
        result.plots["pareto_front"] = tradeoff(result.records, result.pareto, engine.objectives[1],
                                                f"{title}: Pareto front", plots / "pareto_front.png")
        recorder.log_artifact(result.plots["pareto_front"], "plots")


if __name__ == "__main__":  # a worker of spawn_workers: PARENT_RUN_ID INDEX PARENT_PID, the spec's JSON on stdin
    from opbench.lifecycle import end_with_parent, exit_on_sigterm, skip_final_collection
    from opbench.plugins import load_plugins

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    exit_on_sigterm()
    end_with_parent(int(sys.argv[3]))
    load_plugins()
    join_study(TuneSpec.from_json(sys.stdin.read()), sys.argv[1], int(sys.argv[2]), background=True)
    skip_final_collection()
