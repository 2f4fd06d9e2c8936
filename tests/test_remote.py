"""Remote devices: a real TVM RPC tracker and `opbench board serve` servers on 127.0.0.1."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opbench.cli import main
from opbench.hardware.devices import RemoteDevice
from opbench.measure.rpc import list_devices, request_session
from opbench.testing.lan import free_port
from opbench.tracking import read_jsonl, read_mlflow

from .cli import run_cli

pytestmark = pytest.mark.xdist_group("remote")  # one worker sets up the module's expensive fixture once

CLI = [sys.executable, "-m", "opbench.cli"]
KEY = "cpu-farm"
SMALL = "matmul:m=64,n=64,k=64"


class Farm:
    """A tracker and ``n`` servers of one key, each in its own process group (killed whole)."""

    def __init__(self, tmp: Path, servers: int) -> None:
        self.port = free_port()
        self.log = tmp
        self.tracker = self._spawn([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                    "--port", str(self.port), "--port-end", str(self.port + 1)], "tracker")
        self._wait(lambda: list_devices("127.0.0.1", self.port) is not None)
        self.servers = [self._spawn(CLI + ["board", "serve", "--tracker", self.address, "--key", KEY,
                                           "--host", "127.0.0.1", "--port", str(free_port())], f"server{i}")
                        for i in range(servers)]
        self._wait(lambda: sum(k.free for k in list_devices("127.0.0.1", self.port) if k.key == KEY) == servers)

    @property
    def remote(self) -> RemoteDevice:
        return RemoteDevice("127.0.0.1", self.port, KEY)

    @property
    def address(self) -> str:
        return self.remote.tracker

    @property
    def device(self) -> str:
        return self.remote.spec

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        out = open(self.log / f"{name}.log", "w")
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, ready, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while True:
            dead = [p for p in [self.tracker, *getattr(self, "servers", [])] if p.poll() is not None]
            if dead:
                raise RuntimeError(f"RPC farm process exited: {dead[0].args}; logs in {self.log}")
            try:
                if ready():
                    return
            except Exception:
                if time.time() > deadline:
                    raise
            if time.time() > deadline:
                raise TimeoutError("RPC farm did not come up")
            time.sleep(0.3)

    def server_addresses(self) -> list[str]:
        return [s for k in list_devices("127.0.0.1", self.port) if k.key == KEY for s in k.servers]

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in [*self.servers, self.tracker]:
            self.kill(proc)


@pytest.fixture(scope="session")  # not module: xdist may run other files' tests between this file's, and a
def farm(tmp_path_factory):       # module fixture is set up again after each such interruption (26 s each)
    f = Farm(tmp_path_factory.mktemp("farm"), servers=2)
    yield f
    f.close()


def test_devices_lists_the_key_with_both_servers_free(farm):
    out = run_cli(*["devices", "--tracker", farm.address])
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith(KEY))
    assert row.split()[1:4] == ["2", "2", "0"]  # devices, free, used
    assert len(farm.server_addresses()) == 2


def test_tuning_through_the_tracker_spreads_trials_over_both_devices(farm, tmp_path, tracking_uri):
    log = tmp_path / "log.jsonl"
    out = run_cli(*["tune", SMALL, "--engine", "random", "--trials", "6", "--seed", "2",
                                "--device", farm.device, "--remote-workers", "2", "--repeat", "2",
                                "--tracking-uri", tracking_uri, "--study", "remote", "--log", str(log)])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    frame = read_jsonl(log)
    trials = frame[frame["engine_trial"].notna()]
    assert len(trials) == 6 and set(trials["status"]) == {"ok"}
    assert set(frame["reference"].dropna()) == {"te_default", "template_default"}  # no torch/numpy remotely
    assert set(trials["device_addr"]) == set(farm.server_addresses())  # both devices got trials
    assert (trials["max_abs_err"] < 1e-3).all()  # each checked against the reference
    assert set(trials["host"]) == {socket.gethostname()}  # facts the board reported (here: this host)
    stored = read_mlflow(["remote"], tracking_uri)
    assert set(stored["device"]) == {farm.device}
    assert len(stored[stored["engine_trial"].notna()]) == 6


def test_a_busy_key_gives_no_free_device_not_a_hang(farm, tmp_path):
    held = [request_session(farm.remote)[0] for _ in farm.servers]  # every device of the key is now busy
    started = time.time()
    out = run_cli(*["measure", SMALL, "--device", farm.device, "--connect-timeout", "3", "--json",
                                "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    del held  # the sessions end: the module's farm is free again
    assert out.returncode == 1, out.stderr[-2000:]
    record = json.loads(out.stdout)
    assert record["status"] == "device_error"
    assert f"no free '{KEY}' device at tracker {farm.address} within 3 s" in record["error"]
    assert time.time() - started < 60


@pytest.mark.slow
def test_a_server_killed_mid_study_costs_its_trial_and_the_study_finishes_on_the_other(tmp_path, tracking_uri):
    farm = Farm(tmp_path, servers=2)
    log = tmp_path / "log.jsonl"
    try:
        proc = subprocess.Popen(CLI + ["tune", "matmul:m=128,n=128,k=128", "--engine", "random", "--trials", "9",
                                       "--seed", "4", "--device", farm.device, "--remote-workers", "2",
                                       "--repeat", "3", "--no-references", "--run-timeout", "10",
                                       "--tracking-uri", tracking_uri, "--study", "kill", "--log", str(log)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            if log.exists() and sum(1 for _ in log.open()) >= 3:
                break
            time.sleep(0.1)
        victim = farm.servers[1]
        farm.kill(victim)  # the board and every session it serves
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
        frame = read_jsonl(log)
        assert len(frame) == 9
        failed = frame[frame["status"] != "ok"]
        assert len(failed) >= 1 and set(failed["status"]) <= {"device_error", "timeout"}
        assert all("ended during the run" in e or "no free" in e or "remote" in e for e in failed["error"])
        # After the loss every trial ran, and passed, on the surviving device.
        later = frame.iloc[failed.index.max() + 1:]
        assert len(later) >= 3 and set(later["status"]) == {"ok"} and later["device_addr"].nunique() == 1
    finally:
        farm.close()


def test_a_stopped_tracker_is_a_clear_error(tmp_path):
    farm = Farm(tmp_path, servers=0)
    farm.kill(farm.tracker)
    try:
        for cmd in (["devices", "--tracker", farm.address],
                    ["measure", SMALL, "--device", farm.device, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"]):
            out = run_cli(*cmd)
            # refused, or reset while the killed tracker's socket goes away: both name the tracker, exit 2
            assert out.returncode == 2 and re.search(f"tracker {farm.address} (unreachable|did not answer)", out.stderr), out.stderr
    finally:
        farm.close()


@pytest.mark.parametrize("args, message", [
    (["--device", "rpc://nohost/k"], "malformed device 'rpc://nohost/k'"),
    (["--tracker", "127.0.0.1:1"], "--tracker and --key go together"),
    (["--target", "zcu104"], "target 'zcu104' is a board: measure it through a tracker"),
    (["--target", "tpu"], "unknown target 'tpu'"),
    (["--device", "rpc://127.0.0.1:9/k", "--cores", "0"], "core sets apply to local runs only"),
])
def test_bad_device_input_is_a_clear_error(args, message, capsys):
    assert main(["measure", SMALL, *args]) == 2
    assert message in capsys.readouterr().err


def test_nni_experiments_can_run_their_trials_on_remote_devices(tmp_path):
    import yaml

    out = run_cli(*["nni", "new", SMALL, "--target", "zcu104", "--device", "rpc://10.0.0.5:9190/zcu104",
                                "--concurrency", "2", "--out", str(tmp_path / "exp")])
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((tmp_path / "exp" / "config.yml").read_text())
    assert "--target zcu104 --device rpc://10.0.0.5:9190/zcu104" in config["trialCommand"]
    bad = run_cli(*["nni", "new", SMALL, "--device", "tcp://x", "--out", str(tmp_path / "bad")])
    assert bad.returncode == 2 and "malformed device 'tcp://x'" in bad.stderr
