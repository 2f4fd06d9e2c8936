"""Optuna as an engine: journal or RDB storage, batch ask/tell, failed trials told as failed, resumable."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from opbench import settings
from opbench.engines._base import Engine, Proposal, Space, point_of, split_threads
from opbench.engines.optuna.heartbeat import Heartbeat
from opbench.engines.optuna.storage import open_storage, recovered_within, riding_outages
from opbench.exceptions import OpBenchError
from opbench.lifecycle import process_alive, sigterm_deferred
from opbench.record import OBJECTIVE_COLUMNS, TrialRecord, is_ok

log = logging.getLogger(__name__)
_HOST = socket.gethostname()  # on each asked trial: which host measures it
ASKED_BY = "asked_by"  # [host, pid] of the process that asked a trial, set as it is created
T = TypeVar("T")
SAMPLERS = ("tpe", "random", "cmaes", "gp", "nsga2", "grid")


def _sampler(name: str, space: Space, seed: int | None) -> Any:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({k: v["_value"] for k, v in space.items()}, seed=seed)
    raise OpBenchError(f"unknown Optuna sampler '{name}'; samplers: {', '.join(SAMPLERS)}")


# Minimised; "threads" = cores used and "energy" = joules per call, for latency/resource Pareto fronts.
OBJECTIVES = tuple(OBJECTIVE_COLUMNS)


class OptunaEngine(Engine):
    """Optuna's ask/tell over a study in a journal file or a database.

    With a ``budget``, the study's measured trials are counted across every process and host that
    shares it: ``ask`` stops proposing once ``budget`` trials are measured or being measured, and
    waits while another's trial may still fail (a silent host's trial is failed after
    ``STALE_AFTER_S`` and queued again) rather than leave it to nobody. On a database this process
    records a heartbeat for its trials in flight, and rides out the database being away for a while
    (each storage call retried for ``OPBENCH_STORAGE_OUTAGE_S``, then ``StorageUnavailable``).
    """

    def __init__(self, space: Space, threads: int, study: str, storage: str, sampler: str = "tpe",
                 seed: int | None = None, resume: bool = False, objectives: tuple[str, ...] = ("latency",), budget: int | None = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        unknown = [o for o in objectives if o not in OBJECTIVES]
        if unknown or not objectives or objectives[0] != "latency":
            raise OpBenchError(f"objectives must start with latency and be among {', '.join(OBJECTIVES)}; "
                               f"got {','.join(objectives)}")
        self.name = f"optuna-{sampler}"
        self.objectives = objectives
        self._space, self._threads, self.storage_url = space, threads, storage
        self._distributions: dict[str, optuna.distributions.BaseDistribution] = {
            k: optuna.distributions.CategoricalDistribution(v["_value"]) for k, v in space.items()}
        storage = open_storage(storage)
        if not resume:
            with contextlib.suppress(KeyError):
                self._db(lambda: optuna.delete_study(study_name=study, storage=storage))
        self.study: optuna.Study = self._db(lambda: optuna.create_study(
            study_name=study, storage=storage, sampler=_sampler(sampler, space, seed),
            directions=["minimize"] * len(objectives), load_if_exists=True))
        self.budget = budget
        self._in_flight: set[int] = set()  # trial ids asked here and not yet told
        self._first_seen: dict[int, float] = {}  # others' trials without a host yet: when this process saw them
        # What a dead process of this host logged ahead, by engine trial (its write-ahead log; set by the study)
        self.logged_by: Callable[[int], dict[str, TrialRecord]] = lambda pid: {}
        beats = getattr(storage, "get_heartbeat_interval", lambda: None)()  # a database server's storage (shared by hosts)
        self._heartbeat = Heartbeat(storage, self._in_flight) if beats and budget is not None else None

    def enqueue(self, config: dict[str, Any], threads: int) -> None:
        """A waiting trial in the study's storage, which whichever process asks next takes (none when a trial
        with these params is already there: a resumed or shared study is not given it twice)."""
        point = point_of(self._space, config, threads)
        self._db(lambda: self.study.enqueue_trial(point, skip_if_exists=True))

    def recover(self, recorded: dict[str, TrialRecord]) -> list[TrialRecord]:
        """Settle trials a killed process left RUNNING: tell those whose record was written (keyed by
        ``engine_trial``), fail the rest and queue their params again, so nothing is lost or run twice.
        On a database other hosts share, a trial whose process is alive (a fresh heartbeat, or asked
        within ``STALE_AFTER_S`` and none yet) is left to it. Returns the records it told."""
        import optuna

        told = []
        running = self._db(lambda: self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
        gone = self._gone(running)
        for trial in running:
            record = recorded.get(str(trial.number))
            if record is not None:
                self.tell(Proposal({}, 0, optuna.trial.Trial(self.study, trial._trial_id)), record)
                told.append(record)
            elif trial._trial_id in gone:
                self._db(functools.partial(self.study.tell, trial.number, state=optuna.trial.TrialState.FAIL))
                self._db(functools.partial(self.study.enqueue_trial, trial.params))
        return told

    def _gone(self, running: list[Any]) -> set[int]:
        """Ids of the ``running`` trials whose process is gone: on one host's store, all but those of this
        host's live processes; on a shared database, those with a stale heartbeat or abandoned."""
        if not self._heartbeat:
            return {t._trial_id for t in running if not _alive_here(t)}
        stale = set(self._db(lambda: self.study._storage._get_stale_trial_ids(self.study._study_id)))
        return stale | {t._trial_id for t, _ in self._abandoned(running)}

    @property
    def done(self) -> int:
        """Finished trials that were measured (a stale trial failed by :meth:`recover` has no status)."""
        import optuna

        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
        trials = self._db(lambda: self.study.get_trials(deepcopy=False, states=finished))
        return sum(1 for t in trials if "status" in t.user_attrs)

    def _db(self, call: Callable[[], T]) -> T:
        """One storage operation, retried while the database is away (bounded)."""
        return riding_outages(call, self.storage_url)

    def ask(self, n: int) -> list[Proposal]:
        out: list[Proposal] = []
        while len(out) < n and self._budget_left():
            trial = self._claimed()
            config, threads = split_threads(trial.params, self._threads)
            proposal = Proposal(config, threads, trial)
            if self.budget is not None and self._taken_before(trial.number) >= self.budget:
                self.reject(proposal, "over the study's budget: another worker took the last trial")  # a race lost
                continue
            out.append(proposal)
        return out

    def _claimed(self) -> Any:
        """A new trial, marked as this process's (heartbeat, host and pid) before a SIGTERM may end the
        process: a terminated worker's trial is then settled by the next process to look, not left to
        go stale (``STALE_AFTER_S``)."""
        with sigterm_deferred():
            trial = self._db(self._ask_owned)
            self._in_flight.add(trial._trial_id)
            if self._heartbeat:  # first: a trial with a heartbeat is failed by the others if this process dies
                self._heartbeat.beat(trial._trial_id)
            self._db(functools.partial(trial.set_user_attr, "host", _HOST))
            self._db(functools.partial(trial.set_user_attr, "pid", os.getpid()))
        return trial

    def _ask_owned(self) -> Any:
        """``Study.ask`` with the asking host and pid (``asked_by``) set as the trial is created (a queued
        trial's, as it is popped), before the sampler picks its params: a process killed before it marked
        the trial as its own leaves one the next process on this host settles at once (its pid is gone),
        where other hosts wait out ``STALE_AFTER_S`` for a first heartbeat (:meth:`_abandoned`)."""
        import optuna

        study, owner = self.study, {ASKED_BY: [_HOST, os.getpid()]}
        study._thread_local.cached_all_trials = None  # as Study.ask: read the storage afresh once a trial
        trial_id = study._pop_waiting_trial_id()
        if trial_id is None:
            template = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs=owner)
            trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
        else:
            for key, value in owner.items():
                study._storage.set_trial_user_attr(trial_id, key, value)
        trial = optuna.Trial(study, trial_id)
        for name, distribution in self._distributions.items():
            trial._suggest(name, distribution)
        return trial

    def _budget_left(self, poll_s: float = 1.0) -> bool:
        """Whether a trial may be asked: fewer than ``budget`` measured or in flight; while others'
        trials fill the budget, wait for them to be told, or failed as stale (then asked again)."""
        import optuna

        while self.budget is not None:
            if self._heartbeat and not recovered_within(settings.stale_after_s()):  # after an outage, heartbeats resume first
                self._db(lambda: optuna.storages.fail_stale_trials(self.study))
            trials = self._db(lambda: self.study.get_trials(deepcopy=False))
            if self._fail_abandoned(trials):
                continue
            running = [t for t in trials if _in_flight(t)]
            if sum("status" in t.user_attrs for t in trials) + len(running) < self.budget:
                return True
            if all(t._trial_id in self._in_flight for t in running):
                return False
            time.sleep(poll_s)
        return True

    def _fail_abandoned(self, trials: list[Any]) -> bool:
        """Settle the in-flight trials of processes that are gone without a heartbeat to say so
        (:meth:`_abandoned`): told, when the dead process logged its record ahead (:attr:`logged_by`),
        else failed with their params queued again. Whether any was."""
        import optuna

        abandoned = self._abandoned(trials)
        for trial, why in abandoned:
            pid = trial.user_attrs.get("pid") if trial.user_attrs.get("host") == _HOST else None
            record = self.logged_by(int(pid)).get(str(trial.number)) if pid is not None else None
            with contextlib.suppress(ValueError, RuntimeError):  # another worker settled it first
                if record is not None:
                    self.tell(Proposal({}, 0, optuna.trial.Trial(self.study, trial._trial_id)), record)
                else:
                    self._db(functools.partial(self._settle_abandoned, trial, why))
        return bool(abandoned)

    def _abandoned(self, trials: list[Any]) -> list[tuple[Any, str]]:
        """Other processes' in-flight ``trials`` whose process is gone: on this host, a process no longer
        alive (:func:`_owner`); of another host, one that died after asking and before its first heartbeat
        (no host yet) and was seen so by this process for ``STALE_AFTER_S`` (its own clock: hosts' clocks may
        disagree)."""
        now, out = time.monotonic(), []
        for trial in trials:
            if not _in_flight(trial) or trial._trial_id in self._in_flight:
                continue
            host, pid = _owner(trial)
            if host == _HOST and pid is not None and not process_alive(pid):  # None: an old trial, its pid being set
                out.append((trial, f"abandoned: its process (pid {pid}) died"))
            elif "host" not in trial.user_attrs and host != _HOST and \
                    now - self._first_seen.setdefault(trial._trial_id, now) >= settings.stale_after_s():
                out.append((trial, "orphaned: its process died before its first heartbeat"))
        return out

    def _settle_abandoned(self, trial: Any, why: str) -> None:
        import optuna

        self.study._storage.set_trial_user_attr(trial._trial_id, "rejected", why)
        self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        self.study.enqueue_trial(trial.params)

    def _taken_before(self, number: int) -> int:
        """Trials numbered before ``number`` that are measured or in flight (rejected ones are not)."""
        return sum(1 for t in self._db(lambda: self.study.get_trials(deepcopy=False))
                   if t.number < number and ("status" in t.user_attrs or _in_flight(t)))

    def reject(self, proposal: Proposal, reason: str) -> None:
        """Fail the trial with a ``rejected`` attribute (no ``status``: not a measured trial, not counted)."""
        import optuna

        self._db(lambda: proposal.handle.set_user_attr("rejected", reason[:300]))
        self._db(lambda: self.study.tell(proposal.handle, state=optuna.trial.TrialState.FAIL))
        self._in_flight.discard(proposal.handle._trial_id)

    def close(self) -> None:
        if self._heartbeat:
            self._heartbeat.stop()

    def tell(self, proposal: Proposal, record: TrialRecord) -> None:
        try:
            self._tell(proposal, record)
        except (ValueError, RuntimeError):
            if not self._db(lambda: self.study._storage.get_trial(proposal.handle._trial_id)).state.is_finished():
                raise
            # Its heartbeats stopped (the database away longer than STALE_AFTER_S) and another worker failed it and
            # queued its params again: the record stays in MLflow and the log, Optuna measures the params anew.
            log.warning("trial %d was failed as stale by another worker while this one measured it (record %s kept)",
                        proposal.handle.number, record["trial_id"])
        self._in_flight.discard(proposal.handle._trial_id)

    def _tell(self, proposal: Proposal, record: TrialRecord) -> None:
        import optuna

        trial = proposal.handle
        # trial_id first: "status" marks a trial measured, and a SIGTERM between the two must not leave a
        # measured trial that names no record
        self._db(lambda: trial.set_user_attr("trial_id", record["trial_id"]))
        self._db(lambda: trial.set_user_attr("status", record["status"]))
        values = {objective: record.get(column) for objective, column in OBJECTIVE_COLUMNS.items()}
        missing = [o for o in self.objectives if values[o] is None]
        if is_ok(record) and not missing:
            self._db(lambda: self.study.tell(trial, [values[o] for o in self.objectives]))
        else:
            error = record.get("error", "") if not is_ok(record) else f"objective(s) not measured: {missing}"
            self._db(lambda: trial.set_user_attr("error", error[:500]))
            self._db(lambda: self.study.tell(trial, state=optuna.trial.TrialState.FAIL))



def _owner(trial: Any) -> tuple[str | None, int | None]:
    """The host and pid of the process a trial is in flight in: set as the trial was created (``asked_by``),
    else (a trial asked before trials carried it) those the process marked it with, one call after the other."""
    attrs = trial.user_attrs
    host, pid = attrs.get(ASKED_BY) or (attrs.get("host"), attrs.get("pid"))
    return host, pid if isinstance(pid, int) else None


def _alive_here(trial: Any) -> bool:
    """Whether the trial was asked by a process of this host that is still alive."""
    host, pid = _owner(trial)
    return host == _HOST and pid is not None and process_alive(pid)


def _in_flight(trial: Any) -> bool:
    """Asked, not yet told, and not turned away."""
    import optuna

    return trial.state == optuna.trial.TrialState.RUNNING and "rejected" not in trial.user_attrs
