"""Claims verified in fresh processes: a study's best schedule and its references timed again.

Every schedule is re-measured by :meth:`Measurer.measure_fresh`: ``rounds`` placements each, each
placement a process of its own that has run nothing else (the library baselines one that never imports TVM),
the schedules' placements interleaved in random order round by round, so a slow start, a warm cache or a
drifting clock favours no one. A schedule's rounds are its placements; a speed-up is the median of the
per-round ratios with their min-max; it *holds* when it is within :data:`CLAIM_TOLERANCE` of the ratio the
study itself measured.

The study's fastest trial is the minimum of many noisy measurements, so it is often one that was
lucky (the winner's curse). Before that, its fastest distinct configs (:func:`contenders_for`), and
its template default when none of them is, are measured again in fresh processes, and the one with the
lowest estimate is the verified best (so a study never names a best that is slower than its default
there); the re-measurement that reports it is a measurement of its own, so the choice does not bias it.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import LOCAL, Resources, parse_cores
from opbench.measure.estimate import placement_values
from opbench.measure.measurer import Measurer
from opbench.measure.protocol import RunResult
from opbench.measure.types import TrialSpec
from opbench.record import Status, TrialRecord, is_ok
from opbench.report.study_records import measured, references, schedule_key
from opbench.workloads import parse_workload

BEST = "best"
VERIFY_KIND = "verify"  # record_kind of the fresh-process records (not trials of the study)
CLAIM_TOLERANCE = 0.10
DEFAULT_ROUNDS = 3
TRIALS_PER_ROUND = 16  # a study's verification takes a round per this many trials ...
MIN_ROUNDS, MAX_ROUNDS = 2, 5  # ... within these bounds
CONTENDERS = 3  # at most this many of the study's fastest distinct configs timed again (with its default) ...
TRIALS_PER_CONTENDER = 16  # ... one per this many trials (docs/measurement.md#contenders)
CONTENDER_WINDOW = 1.5  # ... those tuned within this factor of the fastest (docs/measurement.md#contenders)
KEPT_BUILDS = CONTENDERS + 2  # a study's fastest trials' builds kept for its verification: contenders, default, te_default
SHORT_SERIES_FACTOR = 20.0  # a reference this many times slower takes one short placement (docs/measurement.md#fresh)
CONTENDER = "contender-"  # verified_as of the records that chose among the contenders: contender-1, -2, ...


@dataclass(frozen=True)
class Spread:
    """A median with the min and max it was taken from."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        finite = [v for v in values if math.isfinite(v)]
        return cls(statistics.median(finite), min(finite), max(finite)) if finite else None


@dataclass
class Verified:
    """One schedule: what the study measured and what each fresh-process round measured (NaN: failed)."""

    name: str
    tuned_ms: float
    rounds_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def latency(self) -> Spread | None:
        return Spread.of(self.rounds_ms)


@dataclass
class Verification:
    """The best schedule and the references of a study, each re-measured in ``rounds`` fresh rounds."""

    study: str
    rounds: int
    schedules: dict[str, Verified]  # BEST first, then the references
    best_trial: str | None = None  # trial_id of the verified best (the fastest contender in a fresh process)
    notes: dict[str, str] = field(default_factory=dict)  # how a schedule was made, where it matters (a tag each)

    @property
    def best(self) -> Verified:
        return self.schedules[BEST]

    def ratio(self, name: str, other: str) -> Spread | None:
        """``name``'s latency over ``other``'s, round by round (the two were timed minutes apart at most); None
        where either was not verified (a reference that failed is not re-measured)."""
        if name not in self.schedules or other not in self.schedules:
            return None
        pairs = zip(self.schedules[name].rounds_ms, self.schedules[other].rounds_ms)
        return Spread.of([a / b for a, b in pairs if b > 0])

    def speedup(self, name: str) -> Spread | None:
        """How many times faster the best schedule is than ``name``: per-round ratios, median and range."""
        return self.ratio(name, BEST)

    def tuned_speedup(self, name: str) -> float:
        best = self.best.tuned_ms
        return self.schedules[name].tuned_ms / best if best > 0 else math.nan

    def holds(self, name: str) -> bool | None:
        """Whether the study's claimed speed-up over ``name`` survived re-measurement (None: unverified)."""
        verified, tuned = self.speedup(name), self.tuned_speedup(name)
        if verified is None or not math.isfinite(tuned):
            return None
        return abs(verified.median / tuned - 1) <= CLAIM_TOLERANCE

    def parent_metrics(self) -> dict[str, float]:
        """What the study's parent run records: verified latencies and speed-ups, each with its range."""
        out: dict[str, float] = {"verify_rounds": float(self.rounds)}
        for name, schedule in self.schedules.items():
            if (lat := schedule.latency) is not None:
                out.update({f"verified_{name}_ms": lat.median, f"verified_{name}_min_ms": lat.lo,
                            f"verified_{name}_max_ms": lat.hi})
            if name != BEST and (up := self.speedup(name)) is not None:
                out.update({f"verified_speedup_vs_{name}": up.median, f"verified_speedup_vs_{name}_min": up.lo,
                            f"verified_speedup_vs_{name}_max": up.hi})
        return out

    def parent_tags(self) -> dict[str, str]:
        verdicts = {name: self.holds(name) for name in self.schedules if name != BEST}
        tags = {f"claim_vs_{name}": "not verified" if v is None else "holds" if v else "does not hold"
                for name, v in verdicts.items()}
        tags.update({f"note_{name}": note for name, note in self.notes.items()})
        return {**tags, "verified_best_trial": self.best_trial} if self.best_trial else tags


def _run_key(record: TrialRecord) -> tuple:
    """What a fresh process runs for ``record``: its workload, template, resources and schedule."""
    return (record.get("workload"), record.get("template"), record.get("threads"), record.get("cores", "any"),
            record.get("target"), schedule_key(record))


def _trials(records: list[TrialRecord]) -> list[TrialRecord]:
    """The study's ok trials, fastest first."""
    return sorted((r for r in measured(records) if not r.get("reference")), key=lambda r: r["latency_ms"])


def fastest_trials(records: list[TrialRecord], count: int = CONTENDERS) -> list[TrialRecord]:
    """The study's ``count`` fastest ok trials with distinct schedules, fastest first."""
    out: dict[tuple, TrialRecord] = {}
    for record in _trials(records):
        out.setdefault(schedule_key(record), record)
        if len(out) == count:
            break
    if not out:
        raise OpBenchError("the study has no successful trial to verify")
    return list(out.values())


def contenders_of(records: list[TrialRecord], count: int | None = None) -> list[TrialRecord]:
    """The ``count`` (default: :func:`contenders_for` its ok trials) :func:`fastest_trials`, then the template
    default when it is not among them (the study's fastest trial of the default's schedule, or the
    template_default reference when no trial has it); of these, those tuned within :data:`CONTENDER_WINDOW`
    of the fastest."""
    fastest = fastest_trials(records, count or contenders_for(len(_trials(records))))
    default = references(records).get("template_default")
    if default is not None and (key := schedule_key(default)) not in {schedule_key(r) for r in fastest}:
        fastest = [*fastest, next((r for r in _trials(records) if schedule_key(r) == key), default)]
    floor = min(r["latency_ms"] for r in fastest)
    return [r for r in fastest if r["latency_ms"] <= CONTENDER_WINDOW * floor]


def select_best(measurer: Measurer, trials: list[TrialRecord], on_record: Callable[[TrialRecord], None] | None = None
                ) -> TrialRecord:
    """The trial among ``trials`` (fastest first) with the lowest estimate in fresh processes
    (docs/measurement.md#contenders); the first where none of them ran there."""
    if len(trials) < 2:
        return trials[0]
    specs = {f"{CONTENDER}{rank}": spec_of(record) for rank, record in enumerate(trials, 1)}
    with measurer.reusing_builds():
        records = measurer.measure_fresh(list(specs.values()))
    for name, record in zip(specs, records):
        record.set(record_kind=VERIFY_KIND, verified_as=name)
        if on_record:
            on_record(record)
    estimates = [(record["latency_ms"], i) for i, record in enumerate(records) if is_ok(record)]
    return trials[min(estimates)[1]] if estimates else trials[0]


def verified_best(records: list[TrialRecord], verification: Verification | None) -> TrialRecord | None:
    """The record of the verified best among ``records`` (None: not verified, or not among them)."""
    chosen = verification.best_trial if verification else None
    return next((r for r in records if r.trial_id == chosen), None) if chosen else None


def spec_of(record: TrialRecord) -> TrialSpec:
    """The trial a record describes, to measure again on this host."""
    if record.device != LOCAL:
        raise OpBenchError(f"records measured on {record.device} are verified on this host only; "
                           f"re-run the study locally to verify it")
    target = "cuda" if "cuda" in record.target else "llvm"
    resources = Resources(int(record.threads), parse_cores(record.cores), target)
    return TrialSpec(parse_workload(record.workload), dict(record.knobs), resources, record.template)


def remeasure(measurer: Measurer, specs: dict[str, TrialSpec], tuned_ms: dict[str, float], rounds: int,
              on_record: Callable[[TrialRecord], None] | None = None, unchosen: Collection[str] = ()
              ) -> dict[str, Verified]:
    """Each named spec measured again in fresh processes, ``rounds`` placements each (its rounds);
    a spec tuned at more than :data:`SHORT_SERIES_FACTOR` times the fastest takes one short placement.
    The re-measures of the ``unchosen`` names (schedules no measurement picked: references) calibrate the
    device's intervals (docs/measurement.md#calibration); a study's best and its contenders were picked for a
    low first measurement, so theirs lean slow (the winner's curse) and do not.

    ``on_record`` sees every fresh-process record (``record_kind`` verify, tagged with the name it
    re-measures), so the evidence is stored beside the claim.
    """
    if rounds < 1:
        raise OpBenchError(f"verification needs at least one round, got {rounds}")
    names = list(specs)
    fastest = min(tuned_ms.values(), default=math.nan)
    short = [i for i, name in enumerate(names) if tuned_ms.get(name, math.nan) > SHORT_SERIES_FACTOR * fastest]
    with measurer.reusing_builds():  # each kernel built once, for all its placements
        records = measurer.measure_fresh([specs[name] for name in names], short, placements=rounds)
    out = {}
    for name, record in zip(names, records):
        record.set(record_kind=VERIFY_KIND, verified_as=name)
        out[name] = _verified(name, tuned_ms.get(name, math.nan), record.get("placement_ms") if is_ok(record) else None,
                              f"{record['status']}: {record.get('error', '')}")
        if name in unchosen and is_ok(record) and (recorded := tuned_ms.get(name, math.nan)) == recorded:
            measurer.calibration.observe(record.device_key, recorded, [record["latency_ms"]])
        if on_record:
            on_record(record)
    return out


def _verified(name: str, tuned_ms: float, rounds_ms: list[float] | None, error: str) -> Verified:
    """A schedule's rounds (its placements' values), or one failed round saying why."""
    if rounds_ms:
        return Verified(name, tuned_ms, list(rounds_ms))
    return Verified(name, tuned_ms, [math.nan], [error[:300]])


def rounds_for(trials: int) -> int:
    """The fresh-process rounds that verify a study of ``trials`` trials: a 3-trial look at a workload is
    checked in :data:`MIN_ROUNDS`, a long study, whose claims get quoted, in up to :data:`MAX_ROUNDS`."""
    return min(MAX_ROUNDS, max(MIN_ROUNDS, math.ceil(trials / TRIALS_PER_ROUND)))


def contenders_for(trials: int) -> int:
    """The fastest configs of a study of ``trials`` ok trials that contend to be its best: the fastest alone (and
    the default) for a short look, more for a long study, whose fastest is likelier a lucky one."""
    return min(CONTENDERS, max(1, math.ceil(trials / TRIALS_PER_CONTENDER)))


def verify(measurer: Measurer, records: list[TrialRecord], study: str, rounds: int = DEFAULT_ROUNDS,
           on_record: Callable[[TrialRecord], None] | None = None, contenders: int | None = None) -> Verification:
    """Name the study's best among its :func:`contenders_of` (:func:`select_best`), then re-measure it and the
    references (see :func:`references`) in fresh processes; a reference that runs the best's own schedule
    shares its processes."""
    with measurer.reusing_builds():  # the best was built for choosing it
        best = select_best(measurer, contenders_of(records, contenders), on_record)
        chosen = {BEST: best, **references(records)}
        twins = [name for name, record in chosen.items() if name != BEST and _run_key(record) == _run_key(best)]
        specs = {name: spec_of(record) for name, record in chosen.items() if name not in twins}
        tuned = {name: float(record["latency_ms"]) for name, record in chosen.items()}
        timed = remeasure(measurer, specs, tuned, rounds, on_record, unchosen=set(specs) - {BEST})
    for name in twins:  # the best's own schedule (the template default nothing beat): its rounds are the best's
        timed[name] = Verified(name, tuned[name], list(timed[BEST].rounds_ms), list(timed[BEST].errors))
    return Verification(study, rounds, {name: timed[name] for name in chosen}, str(best["trial_id"]),
                        dict.fromkeys(twins, f"the best's own schedule, timed as {BEST}"))


def verify_runs(names: list[str], runs: dict[str, RunResult | str], tuned_ms: dict[str, float], study: str,
                rounds: int, twins: dict[str, str] | None = None) -> Verification:
    """Like :func:`verify` for what a TrialSpec cannot describe (whole models): each name's run in fresh
    processes (its placements are its rounds), or why it could not run. A name in ``twins`` is the same
    build as the name it maps to: it was not timed, its rounds are that one's."""
    twins = twins or {}
    out = {}
    for name in names:
        run = runs.get(twins.get(name, name), "not timed")
        if isinstance(run, str):
            out[name] = _verified(name, tuned_ms.get(name, math.nan), None, run)
        else:
            ok = run.status is Status.OK
            out[name] = _verified(name, tuned_ms.get(name, math.nan),
                                  placement_values(run.latencies_s, run.placement_sizes, 1e3) if ok else None,
                                  f"{run.status.value}: {run.error}")
    return Verification(study, rounds, out,
                        notes={name: f"the same build as {same}, timed as {same}" for name, same in twins.items()})
