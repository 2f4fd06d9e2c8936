"""Remote devices: a real TVM RPC tracker and `opbench board serve` servers on 127.0.0.1: faults and
input errors. Studies on a farm whose tracker and boards are hosts of their own: test_scaleout.py."""
from __future__ import annotations

import re
import subprocess
import time

import pytest

from opbench.cli import main
from opbench.testing.farm import CLI, Farm
from opbench.tracking import read_jsonl

from .cli import run_cli

SMALL = "matmul:m=64,n=64,k=64"


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


def test_a_remote_trial_takes_its_placements_as_a_local_one_does(tmp_path):
    """The one placement policy on a loopback RPC device: each placement fresh arguments on the board, the
    library uploaded once a session (loading it again would end the session)."""
    import json

    farm = Farm(tmp_path, servers=1)
    try:
        out = run_cli("measure", SMALL, "--device", farm.device, "--placements", "3", "--max-placements", "6", "--json",
                      "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}")
        assert out.returncode == 0, out.stderr
        record = json.loads(out.stdout)
        assert record["status"] == "ok" and record["device_addr"], record["error"]
        assert 3 <= record["placements"] <= 6 and record["repeat"] == 3 * record["placements"]
        assert record["latency_lo_ms"] <= record["latency_ms"] <= record["latency_hi_ms"]
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
