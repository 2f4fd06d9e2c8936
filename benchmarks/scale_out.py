"""One study on 1, 2 and 3 worker hosts: sqlite (one host) against PostgreSQL and an MLflow server.

Hosts are network namespaces of this machine (``opbench.testing.lan``, as in the scale-out tests):
host-a runs ``opbench tune``, the others ``opbench worker`` on the same study. Per setup, from the
hosts' JSON-lines logs: trials/min (first trial's start to the last one's end) and the per-trial
time between trials on each host (the gap between a host's consecutive records minus the second
one's build, run and check time: Optuna's ask and tell with TPE's sampling, the budget and heartbeat
checks, the MLflow write, and, with several hosts, waiting for the timing lock they share here), and
correctness: measured trials in Optuna, runs in MLflow, both equal to the budget. The hosts share
this machine's cores and timing lock, so trials/min says nothing of speed-up, and only the one-host
rows' gap is storage and logging alone.

    sudo .venv/bin/python benchmarks/scale_out.py [--trials 24] [--workload matmul:m=64,n=64,k=64]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd
from _results import Results

from opbench.engines.optuna.storage import open_storage
from opbench.report.progress import table
from opbench.studies.shared import SPEC_ATTR
from opbench.testing.lan import Network, lan
from opbench.tracking import read_jsonl, read_mlflow

HOSTS = ("host-a", "host-b", "host-c")
CLI = [sys.executable, "-m", "opbench.cli"]


def _published(storage: object, study: str) -> bool:
    try:
        return SPEC_ATTR in optuna.load_study(study_name=study, storage=storage).user_attrs
    except KeyError:
        return False


def run_study(network: Network, hosts: int, study: str, storage: str, tracking: str, args: argparse.Namespace,
              scratch: Path) -> pd.DataFrame:
    """The study on ``hosts`` hosts; every host's logged records (checked: each host exited 0)."""
    def start(host: str, argv: list[str]) -> subprocess.Popen:
        out = open(scratch / f"{study}-{host}.out", "w")
        return subprocess.Popen(network.on(host, CLI + argv + ["--log", str(scratch / f"{study}-{host}.jsonl")]),
                                stdout=out, stderr=subprocess.STDOUT)

    procs = [start(HOSTS[0], ["tune", args.workload, "--study", study, "--storage", storage, "--tracking-uri", tracking,
                              "--trials", str(args.trials), "--threads", "1", "--no-references", "--verify-rounds", "0",
                              "--repeat", "2", "--seed", "0"])]
    if hosts > 1:
        handle = open_storage(storage)
        while not _published(handle, study):
            if procs[0].poll() is not None:
                break
            time.sleep(0.3)
        procs += [start(host, ["worker", "--study", study, "--storage", storage]) for host in HOSTS[1:hosts]]
    for proc, host in zip(procs, HOSTS):
        if proc.wait() != 0:
            raise SystemExit(f"{study} on {host} failed:\n{(scratch / f'{study}-{host}.out').read_text()[-3000:]}")
    logs = [scratch / f"{study}-{host}.jsonl" for host in HOSTS[:hosts]]
    return pd.concat([read_jsonl(log) for log in logs if log.exists()], ignore_index=True)


def gaps_ms(records: pd.DataFrame) -> list[float]:
    """Per host, the time between consecutive records not spent building, running and checking."""
    out = []
    for _, host in records.sort_values("finished_at").groupby("host"):
        gaps = host["finished_at"].diff().iloc[1:] - host["trial_s"].iloc[1:]
        out += [1e3 * gap for gap in gaps]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--workload", default="matmul:m=64,n=64,k=64", help="small: overhead-bound trials")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="opbench-scale-out-"))
    rows = []
    with lan(list(HOSTS), scratch / "artifacts") as (network, cluster, server):
        optuna_url = cluster.url("optuna")
        setups = [("sqlite", 1, f"sqlite:///{scratch}/optuna.db", f"sqlite:///{scratch}/mlflow.db")]
        setups += [("postgresql", n, optuna_url, server.uri) for n in (1, 2, 3)]
        for store, hosts, storage, tracking in setups:
            study = f"{store}-{hosts}"
            print(f"--- {study}: {hosts} host(s), Optuna in {store}, MLflow at {tracking}", flush=True)
            records = run_study(network, hosts, study, storage, tracking, args, scratch)
            trials = optuna.load_study(study_name=study, storage=open_storage(storage)).trials
            measured = sum("status" in t.user_attrs for t in trials)
            runs = read_mlflow([study], tracking)
            runs = runs[runs["engine_trial"].notna()]
            consistent = measured == len(runs) == args.trials and runs["engine_trial"].astype(str).is_unique \
                and set(runs["trial_id"]) <= set(records["trial_id"])
            span = records["finished_at"].max() - (records["finished_at"] - records["trial_s"]).min()
            gaps = gaps_ms(records)
            rows.append((store, hosts, args.trials, measured, len(runs), "yes" if consistent else "NO",
                         round(60 * len(records) / span, 1), round(statistics.median(gaps), 1),
                         round(statistics.quantiles(gaps, n=10)[-1], 1),
                         round(1e3 * statistics.median(records["trial_s"]), 1)))
    results = Results("scale_out")
    results.print(f"\n{args.workload}, 1 thread per host; hosts share this machine's cores (correctness and overhead, "
                  "not speed-up)")
    results.table(table(rows, ["optuna storage", "hosts", "budget", "measured (Optuna)", "MLflow runs", "Optuna = MLflow = log",
                               "trials/min", "gap ms/trial (median)", "p90", "trial ms (median)"]))
    results.print(f"\nlogs: {scratch}")
    results.save()


if __name__ == "__main__":
    main()
