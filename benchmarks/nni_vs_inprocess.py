"""The same TPE study on matmul-512 in-process and under a real ``nnictl`` (concurrency 1 and 2), in one run.

In-process: NNI's TPE tuner driven by OpBench's loop (one trial at a time), recording to a temporary
MLflow store. Under nnictl: the shipped ``experiments/matmul-512-tpe`` with the same trial count, run
in a private network namespace (``unshare -n``, as the tests do), each trial a process that has the
measurement service measure it. No references in either (the rate is that of tuning trials), and then
a short experiment as shipped (references on, a new service): its first trial's time, NNI's RUNNING to
its end, which includes starting the service.

Trials/min come from NNI's own trial start and end times (its experiment database) and, in-process,
from the records' timestamps: over all trials, and warm (from the second trial on: the first one
starts the service, or the in-process workers). The per-trial split is the mean over warm trials (the
means add up to a trial's time; a few long waits decide it when the host is noisy): process start (NNI
spawns the trial until its ``main`` runs), connect (to the service), build, timed run (every attempt's),
host probes+waits (probing the host's speed around each run and waiting for its usual state), other
service work, exit (reply until NNI sees the trial end) and NNI's gap (one trial's end to the next one's
start, at concurrency 1). MLflow logging runs in the
background writer in every mode, off the trial's path.

    .venv/bin/python benchmarks/nni_vs_inprocess.py [--trials 32]   (results: benchmarks/results/)
"""
from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _results import Results

from opbench.engines.loop import run_tuning
from opbench.engines.registry import EngineSpec, create_engine
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions
from opbench.report.progress import table
from opbench.space import get_template
from opbench.tracking import Recorder, read_mlflow
from opbench.workloads import parse_workload

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "experiments" / "matmul-512-tpe"
SESSION = ROOT / "tests" / "nni_session.py"  # nnictl create, wait until DONE, export, stop
TIMING = re.compile(r"^opbench nni trial timing: (\{.*\})$", re.M)


def in_process(trials: int, scratch: Path) -> dict:
    workload, resources = parse_workload("matmul-512"), Resources(2)
    template = get_template(workload)
    engine = create_engine(EngineSpec("nni", tuner="TPE", seed=0), template.search_space(workload), workload, template,
                           resources, "inprocess")
    with Measurer(MeasureOptions(TimingPolicy(repeat=5))) as measurer, \
            Recorder("inprocess", f"sqlite:///{scratch}/mlflow.db", background_lock=HostLock(MeasureOptions().lock_path)) as recorder:
        measurer.warm_up(resources)
        started = time.time()
        records = run_tuning(engine, workload, trials, measurer, recorder, resources, fresh=True)
    engine.close()
    ends = [r["finished_at"] for r in records]
    starts = [started, *ends[:-1]]  # one at a time: a trial starts when the one before it ended
    return _summary("in-process", records, starts, ends, splits=[])


def under_nnictl(trials: int, concurrency: int, scratch: Path, port: int, references: bool = False) -> dict:
    uri = f"sqlite:///{scratch}/mlflow.db"
    config = yaml.safe_load((EXPERIMENT / "config.yml").read_text())
    config.update(maxTrialNumber=trials, trialConcurrency=concurrency, trialCodeDirectory=str(ROOT),
                  experimentWorkingDirectory=str(scratch / "nni"), searchSpaceFile=str(EXPERIMENT / "search_space.json"))
    config["trialCommand"] += f" --tracking-uri {uri} --service-idle-timeout 30" + ("" if references else " --no-references")
    (scratch / "config.yml").write_text(yaml.safe_dump(config))
    out = subprocess.run(["unshare", "-n", sys.executable, str(SESSION), str(scratch / "config.yml"), str(port),
                          str(scratch / "export.csv"), "1800"], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"nnictl experiment failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    database = next((scratch / "nni").glob("*/db/nni.sqlite"))
    events = sqlite3.connect(database).execute("select trialJobId, event, timestamp from TrialJobEvent").fetchall()
    times: dict[str, dict[str, float]] = {}
    for trial, event, stamp in events:
        times.setdefault(trial, {})[event] = stamp / 1e3
    records = {r["nni.trial_id"]: r for r in read_mlflow([config["trialCommand"].split("--study ")[1].split()[0]], uri)
               .to_dict("records")}
    order = sorted(times, key=lambda t: times[t]["RUNNING"])
    splits = []
    for previous, trial in zip([None, *order], order):
        timing = json.loads(TIMING.findall(next((scratch / "nni").glob(f"*/environments/*/trials/{trial}/trial.stderr"))
                                           .read_text())[-1])
        record, start, end = records[trial], times[trial]["RUNNING"], times[trial].get("SUCCEEDED", times[trial].get("FAILED"))
        splits.append({"process start": timing["main"] - start, "connect": timing["connected"] - timing["main"],
                       "build": record["build_s"], "timed run": record["run_s"], "host probes+waits": record["host_wait_s"],
                       "other service": timing["replied"] - timing["connected"] - record["build_s"] - record["run_s"]
                       - record["host_wait_s"],
                       "exit": end - timing["replied"],
                       "NNI gap": start - times[previous]["SUCCEEDED"] if previous and concurrency == 1 else float("nan")})
    ok = [records[t] for t in order]
    mode = f"nnictl, concurrency {concurrency}" + (", references" if references else "")
    return _summary(mode, ok, [times[t]["RUNNING"] for t in order],
                    [max(times[t].values()) for t in order], splits)


def _summary(mode: str, records: list[dict], starts: list[float], ends: list[float], splits: list[dict]) -> dict:
    warm = 60 * (len(ends) - 1) / (max(ends) - min(starts[1:]))
    timed_s = statistics.fmean(r["run_s"] for r in records[1:])
    return {"mode": mode, "trials": len(records), "ok": sum(r["status"] == "ok" for r in records),
            "wall_s": max(ends) - min(starts), "first_s": ends[0] - starts[0],
            "per_min": 60 * len(ends) / (max(ends) - min(starts)), "warm_per_min": warm,
            "kernel_ms": statistics.median(r["latency_ms"] for r in records[1:]), "timed_s": timed_s,
            "harness_s": 60 / warm - timed_s,
            "split": {k: statistics.fmean(s[k] for s in splits[1:]) for k in (splits[0] if splits else {})}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32)
    args = parser.parse_args()
    results = Results("nni_vs_inprocess")
    runs = []
    for mode in ("in-process", 1, 2, "first"):
        scratch = Path(tempfile.mkdtemp(prefix="opbench-nni-bench-"))
        print(f"running: {mode} ...", flush=True)
        if mode == "in-process":
            runs.append(in_process(args.trials, scratch))
        elif mode == "first":  # as shipped: references on, a service of its own, cold
            runs.append(under_nnictl(3, 1, scratch, 18303, references=True))
        else:
            runs.append(under_nnictl(args.trials, int(mode), scratch, 18300 + int(mode)))
    base = runs[0]["warm_per_min"]
    results.table(table([[r["mode"], r["trials"], r["ok"], f"{r['wall_s']:.1f}", f"{r['first_s']:.1f}", f"{r['per_min']:.1f}",
                          f"{r['warm_per_min']:.1f}", f"{r['warm_per_min'] / base:.0%}", f"{r['kernel_ms']:.3g}",
                          f"{r['timed_s']:.3f}", f"{r['harness_s']:.3f}"] for r in runs],
                        ["mode", "trials", "ok", "wall s", "first trial s", "trials/min", "warm trials/min",
                         "warm vs in-process", "median kernel ms", "timed run s/trial", "rest s/trial"]))
    results.print("A rate depends on the configs the tuner proposed (TPE's proposals at concurrency 2 depend on when "
                  "results arrive): 'timed run' is the mean time spent timing a warm trial's kernel, 'rest' the rest of "
                  "the interval between warm trials (the harness's own cost, overlapped at concurrency 2).")
    for run in runs[1:3]:
        results.print(f"\nmean per-trial split (s), {run['mode']}, warm trials:")
        results.table(table([[f"{v:.3f}" for v in run["split"].values()]], list(run["split"])))
    results.save()

if __name__ == "__main__":
    main()
