"""The measurement service NNI trials share: found again by later trials, a thin client that imports
no TVM, torch or MLflow, private per user and store, and its faults (killed mid-trial, a stale socket,
idle exit) cost at most the trial it held."""
import contextlib
import http.server
import json
import multiprocessing
import os
import signal
import socket as sockets
import subprocess
import sys
import threading
import time

import pytest

from opbench.exceptions import OpBenchError
from opbench.integration.nni import channel as nni_channel
from opbench.integration.nni.service import client
from opbench.integration.nni.service.address import authkey, socket_path
from opbench.integration.nni.service.client import ServiceError, measure, service
from opbench.integration.nni.service.protocol import ServiceClosing, ServiceManager, TrialRequest
from opbench.testing.lan import free_port
from opbench.tracking import read_mlflow
from opbench.tracking.store_uri import StoreUnreachable, check_tracking_uri, riding_store_outage

SMALL = "matmul:m=64,n=64,k=64"


@pytest.fixture
def service_dir(tmp_path, monkeypatch):
    folder = tmp_path / "svc"
    monkeypatch.setenv("OPBENCH_SERVICE_DIR", str(folder))  # the service it starts inherits it
    yield folder
    for pid_file in folder.glob("*.pid"):  # stop what the test left running
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_one_service_per_user_and_store(service_dir):
    a, b = socket_path("sqlite:////tmp/a.db"), socket_path("sqlite:////tmp/b.db")
    assert a != b and a == socket_path("sqlite:////tmp/a.db") and a.parent == service_dir
    assert service_dir.stat().st_mode & 0o777 == 0o700  # no other user can reach the sockets


def _accepts(path) -> bool:
    """Whether a server listens on the Unix socket ``path`` (its file appears at bind, before it listens: a client
    refused in between takes the socket for a stale one)."""
    with contextlib.suppress(OSError), sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as probe:
        probe.connect(str(path))
        return True
    return False


def _wait_for(predicate, timeout_s=30.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_trials_share_a_warm_service_that_survives_its_faults(service_dir, tracking_uri, monkeypatch):
    monkeypatch.setenv("OPBENCH_FAULT", "before-reply:SIGKILL:3")  # the service started below dies at its 3rd reply
    request = TrialRequest(SMALL, {}, repeat=2, tracking_uri=tracking_uri, study="svc", engine="nni-test",
                           nni_experiment="exp1", nni_trial="t0")
    first = measure(request, idle_timeout_s=60)
    pid = service(tracking_uri, 60).ping()
    second = measure(TrialRequest(**{**request.__dict__, "nni_trial": "t1", "config": {"vectorize": 0}}), idle_timeout_s=60)
    assert first.record["status"] == second.record["status"] == "ok"
    assert service(tracking_uri, 60).ping() == pid  # the second trial found the same, warm service
    bad = measure(TrialRequest(**{**request.__dict__, "workload": "matmul:m=0"}), idle_timeout_s=60)
    assert bad.record is None and "matmul" in bad.error  # a bad request is a usage error, not a dead service
    service(tracking_uri, 60).flush()
    frame = read_mlflow(["svc"], tracking_uri)
    assert set(frame["nni.trial_id"]) == {"t0", "t1"} and set(frame["engine"]) == {"nni-test"}

    # killed between recording a trial and replying: that trial fails naming the service ...
    with pytest.raises(ServiceError, match=f"measurement service .*pid {pid}.* died during the trial"):
        measure(TrialRequest(**{**request.__dict__, "nni_trial": "t2"}), idle_timeout_s=60)
    assert socket_path(tracking_uri).exists()  # the stale socket is still there ...
    monkeypatch.delenv("OPBENCH_FAULT")
    third = measure(TrialRequest(**{**request.__dict__, "nni_trial": "t3"}), idle_timeout_s=2)
    fresh = service(tracking_uri, 2).ping()
    assert third.record["status"] == "ok" and fresh != pid  # ... and a fresh service replaced it
    assert _wait_for(lambda: not socket_path(tracking_uri).exists(), 30)  # idle: it exits and removes its socket
    # the fresh service replayed the dead one's write-ahead log: t2, measured before the kill, is kept
    assert set(read_mlflow(["svc"], tracking_uri)["nni.trial_id"]) == {"t0", "t1", "t2", "t3"}


class _TrialChannelStandIn(http.server.BaseHTTPRequestHandler):
    """NNI 3.0's HTTP trial channel (``nni_node/common/command_channel/http.js``): GET pops the next
    command for the trial (408 when there is none yet), PUT delivers one from it; beside it, the
    manager's REST API lists the results it stored."""

    queued: list[dict] = []
    received: list[dict] = []
    asked_for_results: list[int] = []  # results stored at each ask

    def do_GET(self):
        if self.path.endswith("/api/v1/nni/trial-jobs/abc"):  # the trial's own job: what NNI made for it
            return self._reply({"trialJobId": "abc", "hyperParameters": [json.dumps(
                {"parameter_id": 7, "parameter_source": "algorithm", "parameters": {"vectorize": 0}, "parameter_index": 0})]})
        if "/api/v1/nni/metric-data/" in self.path:  # the manager's REST API: the results it stored
            stored = [{"trialJobId": "abc", "type": json.loads(c["metric"])["type"]} for c in self.received
                      if c["type"] == "metric"]
            self.asked_for_results.append(len(stored))
            return self._reply(stored)
        if not self.queued:
            self.send_response(408)
            self.end_headers()
            self.queued.append({"type": "parameter", "parameter": json.dumps(  # another trial's, as NNI 3.0 may hand out
                {"parameter_id": 8, "parameter_source": "algorithm", "parameters": {"vectorize": 1}, "parameter_index": 0})})
            return
        self._reply(self.queued.pop(0))

    def _reply(self, content):
        body = json.dumps(content).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class _ChunkedJson(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b'{"hyperParameters": ', b'["a", "b"]}'):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_the_trial_channel_reads_chunked_replies_and_survives_a_silent_manager():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ChunkedJson)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert nni_channel._get(f"http://127.0.0.1:{server.server_port}/api/v1/nni/trial-jobs/x", {}) == \
            {"hyperParameters": ["a", "b"]}
    finally:
        server.shutdown()
        server.server_close()
    assert nni_channel._get(f"http://127.0.0.1:{server.server_port}/gone", "default") == "default"


def test_the_nni_trial_speaks_nnis_channel_without_importing_nni_tvm_torch_or_mlflow(service_dir, tracking_uri):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TrialChannelStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = ("import sys; from opbench.integration.nni import trial; code = trial.main(sys.argv[1:]); "
              "print('heavy', sorted(m for m in ('tvm', 'torch', 'mlflow', 'nni', 'urllib.request', 'ssl') if m in sys.modules)); "
              "sys.exit(code)")
    env = {**os.environ, "NNI_TRIAL_COMMAND_CHANNEL": f"http://127.0.0.1:{server.server_port}/env/e1/abc",
           "NNI_EXP_ID": "exp9", "NNI_TRIAL_JOB_ID": "abc", "NNI_TRIAL_SEQ_ID": "3", "NNI_PLATFORM": "local"}
    try:
        out = subprocess.run([sys.executable, "-c", script, SMALL, "--repeat", "2", "--tracking-uri", tracking_uri,
                              "--service-idle-timeout", "5"], capture_output=True, text=True, timeout=300, env=env)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr[-2000:]
    assert "heavy []" in out.stdout and " ok " in out.stdout
    request, report = _TrialChannelStandIn.received
    assert request == {"type": "request_parameter"}
    metric = json.loads(report["metric"])
    assert (report["type"], metric["parameter_id"], metric["trial_job_id"], metric["type"]) == ("metric", 7, "abc", "FINAL")
    assert json.loads(metric["value"])["default"] > 0
    assert _TrialChannelStandIn.asked_for_results[-1] == 1  # it exited once the manager had its result
    assert _wait_for(lambda: len(read_mlflow(["nni-" + SMALL], tracking_uri)) == 1)  # sequence 3: no references
    record = read_mlflow(["nni-" + SMALL], tracking_uri).iloc[0]
    assert (record["nni.experiment_id"], record["nni.trial_id"], record["knob.vectorize"]) == ("exp9", "abc", 0)


@pytest.mark.slow
def test_a_service_terminated_before_replying_writes_the_trial_it_recorded(service_dir, tracking_uri, monkeypatch):
    """SIGTERM (``kill``, a shutdown) ends the service as an exception would: what it recorded reaches MLflow.
    (Whether the reply still reaches the trial races the exit; either way the record is kept.)"""
    monkeypatch.setenv("OPBENCH_FAULT", "before-reply:SIGTERM:1")
    request = TrialRequest(SMALL, {}, repeat=2, tracking_uri=tracking_uri, study="svc", engine="nni-test",
                           nni_experiment="exp1", nni_trial="t0")
    try:
        replied = {measure(request, idle_timeout_s=60).record["trial_id"]}
    except ServiceError as exc:
        assert "died during the trial" in str(exc)
        replied = set()
    assert _wait_for(lambda: not socket_path(tracking_uri).exists(), 30)  # it cleaned up as it went
    frame = read_mlflow(["svc"], tracking_uri)
    assert list(frame["nni.trial_id"]) == ["t0"] and replied <= set(frame["trial_id"])


def test_the_first_trials_references_follow_its_reply_and_precede_the_next_trial(tracking_uri):
    """An experiment's first trial is answered before its references are timed; the next trial waits for them."""
    from opbench.integration.nni.service.server import MeasurementService

    service = MeasurementService()
    request = TrialRequest(SMALL, {}, repeat=2, tracking_uri=tracking_uri, study="refs", engine="nni-test",
                           nni_experiment="e1", nni_trial="t0", nni_sequence=0, references=True)
    try:
        first = service.measure(request)
        assert first.record["status"] == "ok" and "reference" not in first.record
        assert service.busy == 1  # its references are under way: the service does not idle out
        second = service.measure(TrialRequest(**{**request.__dict__, "nni_trial": "t1", "nni_sequence": 1,
                                                 "references": False}))
        assert service.busy == 0
        service.flush()
    finally:
        service.close()
    frame = read_mlflow(["refs"], tracking_uri)
    refs = frame.dropna(subset=["reference"])
    assert set(refs["reference"]) == {"te_default", "template_default", "torch", "numpy"}
    assert set(refs["nni.trial_id"]) == {"t0"} and set(frame["nni.trial_id"]) == {"t0", "t1"}
    second_started = second.record["finished_at"] - second.record["trial_s"]
    assert refs["finished_at"].max() <= second_started <= first.record["finished_at"] + 600
    assert first.record["finished_at"] < refs["finished_at"].min()  # after the first trial's reply


def test_a_store_away_when_a_trial_opens_it_is_waited_for_and_one_that_stays_away_is_that_trials_error(monkeypatch):
    """A tracking server restarted while an NNI experiment runs: the trial that opens the study's store waits for it
    (up to OPBENCH_STORAGE_OUTAGE_S); a store that never answers ends the trial with an error naming it, before
    anything is measured, and the service goes on."""
    from opbench.integration.nni.service.server import MeasurementService

    port = free_port()  # nothing listens there
    listener: list[sockets.socket] = []

    def reach() -> str:
        try:
            check_tracking_uri(f"http://127.0.0.1:{port}")
        except StoreUnreachable:
            if not listener:  # the server comes back for the next try
                listener.append(sockets.create_server(("127.0.0.1", port)))
            raise
        return "reached"

    assert riding_store_outage(reach, limit_s=60) == "reached" and listener
    listener[0].close()
    url = f"http://127.0.0.1:{free_port()}"  # a store never reached (a reached one is not checked again)
    monkeypatch.setenv("OPBENCH_STORAGE_OUTAGE_S", "0.5")
    with pytest.raises(StoreUnreachable, match=f"MLflow tracking server {url} cannot be reached"):
        riding_store_outage(lambda: check_tracking_uri(url))
    service = MeasurementService()
    try:
        reply = service.measure(TrialRequest(SMALL, {}, repeat=2, tracking_uri=url, study="away", engine="nni-test",
                                             nni_experiment="e1", nni_trial="t0", nni_sequence=0))
        assert reply.record is None and f"MLflow tracking server {url} cannot be reached" in reply.error
        assert service.busy == 0 and not service._measurers  # nothing measured
    finally:
        service.close()


def test_a_service_that_began_to_exit_idle_takes_no_more_calls(tracking_uri):
    """Deciding to exit and refusing calls are one step: a trial that arrives as the service idles out is
    refused before anything is measured (the client then asks the next service), never half taken."""
    from opbench.integration.nni.service.server import MeasurementService

    service = MeasurementService()
    service.last_active -= 60
    service.busy = 1  # a trial or references in flight: never idle
    assert not service.stop_if_idle(10)
    service.busy = 0
    service.ping()  # a client that pinged is about to send its trial
    assert not service.stop_if_idle(10)
    service.last_active -= 60
    assert service.stop_if_idle(10) and service.stop_if_idle(10)
    request = TrialRequest(SMALL, {}, repeat=2, tracking_uri=tracking_uri, study="closing", engine="nni-test")
    with pytest.raises(ServiceClosing, match="exiting"):
        service.ping()
    with pytest.raises(ServiceClosing, match="exiting"):
        service.measure(request)
    service.close()
    assert service.busy == 0
    with pytest.raises(OpBenchError, match="no MLflow experiment named 'closing'"):  # it made no recorder
        read_mlflow(["closing"], tracking_uri)


class _ClosingServer(ServiceManager):
    """A real manager server at a service's socket whose service is exiting, as one is between idling out
    and removing its socket."""


def _serve_exiting(socket, refused):
    """In a process of its own: a service that refuses every call (``refused`` marks the first) and, a second
    after the first, removes its socket and exits, as one that finished its writes does."""
    from opbench.integration.nni.service.server import MeasurementService

    exiting = MeasurementService()
    exiting.last_active -= 60
    assert exiting.stop_if_idle(1)
    real_ping = exiting.ping

    def ping_then_go() -> int:
        refused.touch()
        threading.Timer(1.0, lambda: (socket.unlink(), os._exit(0))).start()
        return real_ping()

    exiting.ping = ping_then_go
    _ClosingServer.register("service", callable=lambda: exiting)
    _ClosingServer(address=str(socket), authkey=authkey(socket, create=True)).get_server().serve_forever()


@pytest.mark.slow
def test_a_trial_that_finds_the_service_exiting_is_measured_by_the_next_one(service_dir, tracking_uri, tmp_path):
    socket, refused = socket_path(tracking_uri), tmp_path / "refused"
    exiting = multiprocessing.get_context("fork").Process(target=_serve_exiting, args=(socket, refused), daemon=True)
    exiting.start()
    assert _wait_for(lambda: _accepts(socket), 30)
    request = TrialRequest(SMALL, {}, repeat=2, tracking_uri=tracking_uri, study="next", engine="nni-test",
                           nni_experiment="exp1", nni_trial="t0")
    reply = measure(request, idle_timeout_s=2)
    assert refused.exists() and reply.record["status"] == "ok"
    exiting.join(10)
    assert exiting.exitcode == 0  # it went, and a service of its own measured the trial
    assert _wait_for(lambda: not socket.exists(), 30)
    assert list(read_mlflow(["next"], tracking_uri)["nni.trial_id"]) == ["t0"]


class _Gone:
    """A proxy of a service that is gone before its first call (its socket's connection refused or missing)."""

    def ping(self):
        raise FileNotFoundError("no such socket")

    def measure(self, request):
        raise AssertionError("a gone service is asked nothing more")


class _Measuring:
    def ping(self):
        return 4242

    def measure(self, request):
        return f"measured {request.nni_trial}"


def test_a_service_gone_before_the_trial_asked_it_anything_leaves_the_trial_to_the_next_one(tmp_path, monkeypatch):
    """The race an idle exit leaves: the service removed its socket after the trial found it and before its first call
    (seen in CI as a trial lost under nnictl). Nothing was sent, so the next service measures the trial; a service
    gone mid-trial, or before its first call with its socket still there, is that trial's error as before."""
    socket = tmp_path / "svc.sock"
    monkeypatch.setattr(client, "socket_path", lambda uri: socket)
    proxies = iter([_Gone(), _Measuring()])
    monkeypatch.setattr(client, "service", lambda uri, idle_timeout_s: next(proxies))
    request = TrialRequest(SMALL, {}, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", study="s", nni_trial="t0")
    assert measure(request, idle_timeout_s=1) == "measured t0"
    socket.touch()  # a socket left behind: a service that died, not one that exited idle
    with pytest.raises(ServiceError, match="died during the trial"):
        client._measure_in(_Gone(), request, socket, None)
