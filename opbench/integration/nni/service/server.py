"""The service process: measures trials with warm workers and hands records to MLflow writers that
never run while a kernel is being timed (``python -m opbench.integration.nni.service SOCKET``)."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from opbench.engines.loop import ENGINE_TRIAL_TAG
from opbench.exceptions import OpBenchError
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources, parse_cores
from opbench.integration.nni.service.address import authkey, open_private
from opbench.integration.nni.service.protocol import ServiceClosing, ServiceManager, TrialReply, TrialRequest
from opbench.lifecycle import exit_on_sigterm, fault_point
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions, TrialSpec
from opbench.measure.worker.zygotes import close_zygotes
from opbench.studies.references import measure_references
from opbench.tracking import Recorder
from opbench.tracking.mlflow_store import nni_parent_run
from opbench.tracking.store_uri import riding_store_outage
from opbench.workloads import parse_workload

log = logging.getLogger("opbench")
IDLE_TIMEOUT_S = 600.0


class MeasurementService:
    """Warm measurers per measure options and recorders per study; one trial at a time."""

    def __init__(self) -> None:
        self._measurers: dict[tuple, Measurer] = {}
        self._recorders: dict[tuple, Recorder] = {}
        self._trial = threading.Lock()  # timed runs are exclusive; a trial's builds share its workers
        self._lock = HostLock(MeasureOptions().lock_path)
        self.last_active = time.monotonic()
        self.busy = 0  # trials being measured or waiting for their turn, and references being measured
        self.closing = False  # set once, by stop_if_idle or close: every later call raises ServiceClosing
        self._busy_lock = threading.Lock()

    def ping(self) -> int:
        """The service's pid; a ping counts as activity, so the trial that follows it finds the service open."""
        self._admit(0)
        return os.getpid()

    def measure(self, request: TrialRequest) -> TrialReply:
        """Measure and record one trial; the references it asks for are measured after its reply, before
        the next trial, so an experiment's first trial does not wait for them."""
        self._admit()
        try:
            with self._trial:
                reply = self._measure(request)
            if request.references and reply.record is not None:
                self._count(+1)  # the service is busy until they are recorded
                threading.Thread(target=self._references, args=(request,), name="references", daemon=True).start()
        finally:
            self._count(-1)
        return reply

    def stop_if_idle(self, idle_timeout_s: float) -> bool:
        """Whether the service has been idle for ``idle_timeout_s``; if so it is closing from now on, in the
        same step, so no call can slip in between the check and the exit."""
        with self._busy_lock:
            self.closing = self.closing or (not self.busy and time.monotonic() - self.last_active >= idle_timeout_s)
            return self.closing

    def _references(self, request: TrialRequest) -> None:
        try:
            with self._trial:
                workload = parse_workload(request.workload)
                resources = Resources(request.threads, parse_cores(request.cores), request.target, request.device)
                recorder, tags = self._recorder(request, request.study or f"nni-{workload.name}"), _nni_tags(request)
                measure_references(self._measurer(request), workload, resources, lambda r: recorder(r.replace(**tags)),
                                   request.template)
        except Exception:
            log.exception("references of %s", request.workload)
        finally:
            self._count(-1)

    def _admit(self, change: int = +1) -> None:
        """Count a new call in (a ping: 0, activity only); ServiceClosing, counting nothing, once closing."""
        with self._busy_lock:
            if self.closing:
                raise ServiceClosing(f"measurement service pid {os.getpid()} is exiting")
            self._count_locked(change)

    def _count(self, change: int) -> None:
        """Count work of a call already admitted in (+1) or out (-1)."""
        with self._busy_lock:  # the connections' threads and the idle watchdog all read it
            self._count_locked(change)

    def _count_locked(self, change: int) -> None:
        self.busy += change
        self.last_active = time.monotonic()

    def _measure(self, request: TrialRequest) -> TrialReply:
        try:
            workload = parse_workload(request.workload)
            if not isinstance(request.threads, int) or isinstance(request.threads, bool):
                raise OpBenchError(f"threads must be an integer, got {request.threads!r}")
            resources = Resources(request.threads, parse_cores(request.cores), request.target, request.device)
        except OpBenchError as exc:
            return TrialReply(None, str(exc))
        try:
            recorder = self._recorder(request, request.study or f"nni-{workload.name}")
        except OpBenchError as exc:  # a store still away after the outage window, or one never reached
            return TrialReply(None, str(exc))
        tags = _nni_tags(request)
        engine_tags = {**tags, ENGINE_TRIAL_TAG: str(request.nni_sequence)} if request.nni_experiment else tags
        spec = TrialSpec(workload, request.config, resources, request.template, tags=engine_tags)
        record = self._measurer(request).measure(spec)
        recorder(record)
        fault_point("before-reply")
        return TrialReply(record.to_row())

    def _measurer(self, request: TrialRequest) -> Measurer:
        """The warm measurer of the request's measure options."""
        key = (request.repeat, request.build_timeout_s, request.run_timeout_s)
        if key not in self._measurers:
            self._measurers[key] = Measurer(MeasureOptions(TimingPolicy(repeat=request.repeat), run_timeout_s=request.run_timeout_s,
                                                           build_timeout_s=request.build_timeout_s))
        return self._measurers[key]

    def _recorder(self, request: TrialRequest, study: str) -> Recorder:
        """The study's recorder, opened at its first trial; a tracking store away meanwhile (a server restarted
        while the experiment runs) is waited for (:func:`~opbench.tracking.store_uri.riding_store_outage`)."""
        key = (study, request.tracking_uri, request.log, request.engine, request.nni_experiment)
        if key not in self._recorders:
            self._recorders[key] = riding_store_outage(lambda: self._open_recorder(request, study))
        return self._recorders[key]

    def _open_recorder(self, request: TrialRequest, study: str) -> Recorder:
        parent = nni_parent_run(study, request.tracking_uri, request.nni_experiment) if request.nni_experiment else None
        return Recorder(study, request.tracking_uri, request.log, extra={"engine": request.engine},
                        parent_run_id=parent, background_lock=self._lock, best_so_far=bool(request.nni_experiment))

    def flush(self) -> None:
        """Return when every record measured so far is in MLflow."""
        for recorder in list(self._recorders.values()):
            recorder.flush()

    def close(self) -> None:
        """Refuse every later call, then end the recorders (writing what they queued) and the measurers."""
        with self._busy_lock:
            self.closing = True
        for recorder in list(self._recorders.values()):
            recorder.__exit__(None)
        for measurer in list(self._measurers.values()):
            measurer.__exit__(None, None, None)


def _nni_tags(request: TrialRequest) -> dict[str, str]:
    """The tags of every record a request makes: NNI's experiment and trial ids, and the request's own."""
    return {"nni.experiment_id": request.nni_experiment, "nni.trial_id": request.nni_trial, **request.tags}


def serve(socket: Path, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Listen on ``socket`` until no trial came for ``idle_timeout_s``; then record what is queued and exit."""
    service = MeasurementService()
    ServiceManager.register("service", callable=lambda: service)
    socket.unlink(missing_ok=True)
    server = ServiceManager(address=str(socket), authkey=authkey(socket, create=True)).get_server()
    with os.fdopen(open_private(socket.with_suffix(".pid"), "w"), "w") as pid:
        pid.write(str(os.getpid()))

    def stop_when_idle() -> None:
        while not service.stop_if_idle(idle_timeout_s):
            time.sleep(min(1.0, idle_timeout_s / 4))
        log.info("measurement service %s idle for %.0f s: exiting", socket, idle_timeout_s)
        try:
            service.close()
        except Exception:
            log.exception("closing the measurement service %s", socket)
        finally:  # whatever closing raised, the process goes (a service left running would never be asked again)
            socket.unlink(missing_ok=True)
            socket.with_suffix(".pid").unlink(missing_ok=True)
            close_zygotes()  # os._exit runs no atexit hooks
            os._exit(0)  # the manager's server has no clean stop from another thread

    threading.Thread(target=stop_when_idle, name="idle-timeout", daemon=True).start()
    log.info("measurement service pid %d on %s", os.getpid(), socket)
    exit_on_sigterm()
    try:
        server.serve_forever()
    finally:  # SIGTERM or SIGINT: what the recorders hold is written before the service goes
        service.close()
        socket.unlink(missing_ok=True)
        socket.with_suffix(".pid").unlink(missing_ok=True)
