"""An NNI trial: ``python -m opbench.engines.nni_trial WORKLOAD [options]`` (the ``trialCommand``).

Reads the config from ``nni.get_next_parameter()``, measures it with the core loop, records it to
MLflow (tagged with NNI's experiment and trial ids, under one parent run per NNI experiment) and
reports latency (``default``, minimised) and GFLOP/s with ``nni.report_final_result``. A trial that
fails to build, crashes, hangs or computes a wrong result is recorded and exits non-zero, so NNI
marks it FAILED: no fake latency reaches the tuner. The experiment's first trial (sequence 0) also
records the references (TE default, template default, torch, numpy).
"""
from __future__ import annotations

import argparse
import sys

from opbench.engines._base import split_threads
from opbench.exceptions import OpBenchError
from opbench.record import is_ok
from opbench.report.progress import TrialPrinter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opbench.engines.nni_trial", description=__doc__.splitlines()[0])
    p.add_argument("workload")
    p.add_argument("--template")
    p.add_argument("--threads", type=int, default=1, help="threads unless the search space has 'threads'")
    p.add_argument("--cores", help="pin to these cores, e.g. 0,1")
    p.add_argument("--target", default="llvm")
    p.add_argument("--device", default="local", help="local or rpc://HOST:PORT/KEY")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--build-timeout", type=float, default=60.0)
    p.add_argument("--run-timeout", type=float, default=120.0)
    p.add_argument("--study", help="MLflow experiment (default nni-<workload>)")
    p.add_argument("--tracking-uri")
    p.add_argument("--log", help="also append records to this JSON-lines file")
    p.add_argument("--tuner", default="", help="the experiment's NNI tuner, recorded as engine nni-<tuner>")
    p.add_argument("--no-references", action="store_true", help="the first trial skips the reference timings")
    return p


def main(argv: list[str] | None = None) -> int:
    import nni

    from opbench.engines.driver import measure_references
    from opbench.hardware.resources import Resources, parse_cores
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions, TrialSpec
    from opbench.plugins import load_plugins
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import nni_parent_run
    from opbench.workloads import parse_workload

    load_plugins()
    args = build_parser().parse_args(argv)
    try:
        workload = parse_workload(args.workload)
        config, threads = split_threads(nni.get_next_parameter() or {}, args.threads)
        resources = Resources(threads, parse_cores(args.cores), args.target, args.device)
        study = args.study or f"nni-{workload.name}"
        experiment, trial = nni.get_experiment_id(), nni.get_trial_id()
        ids = {"nni.experiment_id": experiment, "nni.trial_id": trial}
        options = MeasureOptions(repeat=args.repeat, build_timeout_s=args.build_timeout, run_timeout_s=args.run_timeout)
        engine = f"nni-{args.tuner.lower()}" if args.tuner else "nni"
        parent = nni_parent_run(study, args.tracking_uri, experiment)
        with Measurer(options) as measurer, \
                Recorder(study, args.tracking_uri, args.log, extra={"engine": engine}, parent_run_id=parent) as recorder:
            if nni.get_sequence_id() == 0 and not args.no_references:
                measure_references(measurer, workload, resources, lambda r: recorder({**r, **ids}))
            record = measurer.measure(TrialSpec(workload, config, resources, args.template, tags=ids))
            recorder(record)
    except OpBenchError as exc:
        print(f"opbench nni trial: error: {exc}", file=sys.stderr)
        return 2
    TrialPrinter(None, sys.stdout)(record)
    if not is_ok(record):
        return 1
    nni.report_final_result({"default": record["latency_ms"], "latency_ms": record["latency_ms"],
                             "gflops": record["gflops"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
