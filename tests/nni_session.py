"""Runs one NNI experiment with plain ``nnictl`` and exports it; the test runs this inside ``unshare -n``.

Usage: python tests/nni_session.py CONFIG PORT EXPORT_CSV [TIMEOUT_S]
Brings loopback up (a fresh network namespace has it down), ``nnictl create``s the experiment,
waits until NNI reports it DONE, ``nnictl experiment export``s the trials as CSV and stops it (only
it: other experiments may be running beside it). NNI's launcher gives its manager about 4 s to answer
before it kills it and fails (``_check_rest_server``): on a host busy with the rest of the suite a manager
answered late once in 5 experiments, so a create that failed there is tried again. The manager gives the tuner
process 10 s to connect (importing NNI alone takes 2-3 s of it) and stops the experiment, no trial run, when it
is late: that experiment is stopped and created again. ``nnictl experiment export``
gives it 5 s and exits 0 without writing the file when it is late, so an export is tried until the file is there.
"""
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

NNICTL = str(Path(sys.executable).with_name("nnictl"))
CREATE_ATTEMPTS = EXPORT_ATTEMPTS = 3
TUNER_LATE = "Tuner did not connect in 10 seconds"  # NNI's manager's fixed wait for its dispatcher


def main(config: str, port: str, export: str, timeout_s: float = 400.0) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    base = f"http://127.0.0.1:{port}/api/v1/nni"
    for attempt in range(CREATE_ATTEMPTS):
        time.sleep(2 if attempt else 0)  # the stopped manager frees its port
        created = _create(config, port)
        if created:
            return created
        experiment = json.load(urllib.request.urlopen(f"{base}/experiment"))["id"]
        try:
            status = _wait_until_done(base, timeout_s)
            print("status", status, "experiment", experiment, flush=True)
            late_tuner = any(TUNER_LATE in str(error) for error in status.get("errors", []))
            if late_tuner and attempt < CREATE_ATTEMPTS - 1:
                continue  # no trial ran: NNI stopped the experiment before its tuner connected
            exported = _export(experiment, export)
        finally:
            subprocess.run([NNICTL, "stop", experiment], capture_output=True)
        return 0 if status.get("status") == "DONE" and exported else 1
    return 1


def _create(config: str, port: str) -> int:
    """``nnictl create``, tried again where NNI's launcher killed a manager that answered late (its exit status)."""
    for attempt in range(CREATE_ATTEMPTS):
        out = subprocess.run([NNICTL, "create", "--config", config, "--port", port], capture_output=True, text=True)
        print(out.stdout, out.stderr, flush=True)
        if out.returncode == 0 or "_check_rest_server" not in out.stderr or attempt == CREATE_ATTEMPTS - 1:
            return out.returncode
        time.sleep(2)  # NNI killed the manager that answered late: its port frees
    return 1


def _wait_until_done(base: str, timeout_s: float) -> dict:
    deadline, status = time.time() + timeout_s, {}
    while time.time() < deadline:
        status = json.load(urllib.request.urlopen(f"{base}/check-status"))
        if status["status"] in ("DONE", "ERROR", "STOPPED"):
            break
        time.sleep(1)
    return status


def _export(experiment: str, path: str) -> bool:
    """``nnictl experiment export`` to ``path``, tried again while the file is not there."""
    for _ in range(EXPORT_ATTEMPTS):
        out = subprocess.run([NNICTL, "experiment", "export", experiment, "--filename", path, "--type", "csv"],
                             capture_output=True, text=True, check=True)
        if Path(path).exists():
            return True
        print("export wrote nothing:", out.stdout, out.stderr, flush=True)
        time.sleep(2)
    return False


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4], *map(float, sys.argv[4:5])))
