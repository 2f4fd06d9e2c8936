"""An NNI trial: ``python -m opbench.integration.nni.trial WORKLOAD [options]`` (the ``trialCommand``).

A thin client (it imports neither TVM, torch, MLflow nor, under NNI's local training service, NNI
itself: :mod:`opbench.integration.nni.channel` speaks NNI's trial channel): it gets its config from NNI
and has the user's measurement service for this MLflow store
(:mod:`opbench.integration.nni.service`, started by the first trial that needs it, warm for the ones after) measure it
and record it to MLflow, tagged with NNI's experiment and trial ids under one parent run per NNI
experiment. It reports latency (``default``, minimised) and GFLOP/s as its final result.
A trial that fails to build, crashes, hangs or computes a wrong result is recorded and exits non-zero,
so NNI marks it FAILED: no fake latency reaches the tuner; so does a trial whose service died. It
prints when it started, connected and got its reply to stderr (``opbench nni trial timing: {...}``). The
experiment's first trial (sequence 0) also has the references recorded (TE default, template default,
torch, numpy), which the service times after its reply and before the next trial.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from opbench import settings
from opbench.argtypes import positive_float, positive_int
from opbench.engines._base import split_threads
from opbench.record import TrialRecord, is_ok
from opbench.report.progress import TrialPrinter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opbench.integration.nni.trial", description=__doc__.splitlines()[0])
    p.add_argument("workload")
    p.add_argument("--template")
    p.add_argument("--threads", type=positive_int, default=1, help="threads unless the search space has 'threads'")
    p.add_argument("--cores", help="pin to these cores, e.g. 0,1")
    p.add_argument("--target", default="llvm")
    p.add_argument("--device", default="local", help="local or rpc://HOST:PORT/KEY")
    p.add_argument("--repeat", type=positive_int, default=settings.REPEAT)
    p.add_argument("--build-timeout", type=positive_float, default=settings.BUILD_TIMEOUT_S)
    p.add_argument("--run-timeout", type=positive_float, default=settings.RUN_TIMEOUT_S)
    p.add_argument("--study", help="MLflow experiment (default nni-<workload>)")
    p.add_argument("--tracking-uri")
    p.add_argument("--log", help="also append records to this JSON-lines file")
    p.add_argument("--tuner", default="", help="the experiment's NNI tuner, recorded as engine nni-<tuner>")
    p.add_argument("--no-references", action="store_true", help="the first trial skips the reference timings")
    p.add_argument("--service-idle-timeout", type=positive_float, default=600.0,
                   help="seconds a measurement service started by this trial waits for the next one")
    return p


def main(argv: list[str] | None = None) -> int:
    from opbench.integration.nni.channel import TrialChannel, identity
    from opbench.integration.nni.service.client import ServiceError, measure
    from opbench.integration.nni.service.protocol import TrialRequest

    timings = {"main": time.time()}  # when this process got to work (NNI spawned it at the trial's start)
    args = build_parser().parse_args(argv)
    channel, trial = TrialChannel(), identity()
    config, threads = split_threads(channel.next_parameter(), args.threads)
    request = TrialRequest(args.workload, config, threads, args.cores, args.target, args.device, args.template, args.repeat,
                           args.build_timeout, args.run_timeout, args.study, args.tracking_uri, args.log,
                           f"nni-{args.tuner.lower()}" if args.tuner else "nni", trial.experiment, trial.trial, trial.sequence,
                           references=trial.sequence == 0 and not args.no_references)
    try:
        reply = measure(request, args.service_idle_timeout, timings)
    except ServiceError as exc:
        print(f"opbench nni trial: {exc}", file=sys.stderr)
        return 1
    timings["replied"] = time.time()
    print(f"opbench nni trial timing: {json.dumps(timings)}", file=sys.stderr)
    if reply.record is None:
        print(f"opbench nni trial: error: {reply.error}", file=sys.stderr)
        return 2
    record = TrialRecord.from_row(reply.record)
    TrialPrinter(None, sys.stdout)(record)
    if not is_ok(record):
        return 1
    channel.report_final({"default": record["latency_ms"], "latency_ms": record["latency_ms"],
                             "gflops": record["gflops"]})
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (~40 ms): NNI sees the trial end, and starts the next, that much sooner
