"""The measurement service NNI trials share: found again by later trials, a thin client that imports
no TVM, torch or MLflow, private per user and store, and its faults (killed mid-trial, a stale socket,
idle exit) cost at most the trial it held."""
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from opbench.service.address import socket_path
from opbench.service.client import ServiceError, measure, service
from opbench.service.protocol import TrialRequest
from opbench.tracking import read_mlflow

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


def _wait_for(predicate, timeout_s=30.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_trials_share_a_warm_service_that_survives_its_faults(service_dir, tracking_uri):
    request = TrialRequest(SMALL, {}, repeat=2, tracking_uri=tracking_uri, study="svc", engine="nni-test",
                           nni_experiment="exp1", nni_trial="t0")
    first = measure(request, idle_timeout_s=60)
    pid = service(tracking_uri, 60).ping()
    second = measure(TrialRequest(**{**request.__dict__, "nni_trial": "t1", "config": {"vectorize": 0}}), idle_timeout_s=60)
    assert first.record["status"] == second.record["status"] == "ok"
    assert service(tracking_uri, 60).ping() == pid  # the second trial found the same, warm service
    bad = measure(TrialRequest(**{**request.__dict__, "workload": "matmul:m=0"}), idle_timeout_s=60)
    assert bad.record is None and "matmul" in bad.error  # a bad request is a usage error, not a dead service
    assert _wait_for(lambda: len(read_mlflow(["svc"], tracking_uri)) == 2)  # the writer recorded both
    frame = read_mlflow(["svc"], tracking_uri)
    assert set(frame["nni.trial_id"]) == {"t0", "t1"} and set(frame["engine"]) == {"nni-test"}

    # killed mid-trial: that trial fails naming the service; the next one starts a fresh service
    errors = []
    slow = TrialRequest(**{**request.__dict__, "workload": "matmul-512", "repeat": 5, "nni_trial": "t2"})
    thread = threading.Thread(target=lambda: errors.append(_error_of(slow)))
    thread.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    assert errors and "measurement service" in errors[0] and f"pid {pid}" in errors[0] and "died during the trial" in errors[0]
    assert socket_path(tracking_uri).exists()  # the stale socket is still there ...
    third = measure(TrialRequest(**{**request.__dict__, "nni_trial": "t3"}), idle_timeout_s=2)
    fresh = service(tracking_uri, 2).ping()
    assert third.record["status"] == "ok" and fresh != pid  # ... and a fresh service replaced it
    assert _wait_for(lambda: not socket_path(tracking_uri).exists(), 30)  # idle: it exits and removes its socket
    assert _wait_for(lambda: len(read_mlflow(["svc"], tracking_uri)) == 3)  # t0, t1, t3: nothing recorded was lost


def _error_of(request):
    try:
        measure(request, idle_timeout_s=60)
    except ServiceError as exc:
        return str(exc)
    return ""


def test_the_nni_trial_process_imports_no_tvm_torch_or_mlflow(service_dir, tracking_uri):
    script = ("import sys; from opbench.engines import nni_trial; code = nni_trial.main(sys.argv[1:]); "
              "print('heavy', sorted(m for m in ('tvm', 'torch', 'mlflow') if m in sys.modules)); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", script, SMALL, "--repeat", "2", "--tracking-uri", tracking_uri,
                          "--no-references", "--service-idle-timeout", "5"],
                         capture_output=True, text=True, timeout=300)  # NNI in standalone mode: no manager
    assert out.returncode == 0, out.stderr[-2000:]
    assert "heavy []" in out.stdout and " ok " in out.stdout
