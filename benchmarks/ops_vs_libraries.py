"""OpBench kernels against PyTorch and numpy, measured in one run with the same threads.

For matmul-512, resnet50-c2 and bert-base-ffn1 (and any ``--workloads``, int8 and bf16 ones among them): TVM's TE
default schedule, the template default, the best of a small Optuna sweep and the libraries (numpy and torch; ONNX
Runtime for int8), each verified: re-measured in fresh processes in 3 alternating rounds (libraries in processes that
never load TVM). Latency (median of the rounds, with their range), GFLOP/s (GOP/s for int8), ratio to the first
library (torch; int8: ONNX Runtime; per round, with its range; a library whose output was wrong is said under the
table), share of the host's fp32 GEMM ceiling (the faster of torch's and numpy's 2048^3 fp32 GEMM, measured in the
same run), share of the host's measured peak of the dtype (fp32 FMA chains; int8, bf16: AMX tiles', else the
dot-product instruction's: opbench.space.peak_units), and
the framework's overhead: study wall time minus every trial's build and run and its time probing the host's speed and
waiting out its spells (shown beside it: opbench.hardware.host_speed), as a fraction, with every record logged to a
real (temporary) MLflow sqlite store through the background writer ``opbench tune`` uses, plus trials per minute.
Studies run as ``opbench tune`` runs them by default: one config per step (so no two builds overlap and the build and
run times add up to the work) and Optuna's storage in a journal file (``--storage URL`` for a database instead).

    .venv/bin/python benchmarks/ops_vs_libraries.py [--trials 40] [--threads 2] [--workloads matmul-512 ...]
        [--storage sqlite:///optuna.db]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _ceiling import ceiling_line, gemm_ceiling
from _results import Results

from opbench.engines.loop import run_tuning
from opbench.engines.optuna.engine import OptunaEngine
from opbench.engines.optuna.storage import default_storage
from opbench.hardware.lock import HostLock
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.types import MeasureOptions
from opbench.record import tee
from opbench.report.progress import TrialPrinter, table
from opbench.space import get_template
from opbench.studies.references import library_references, measure_references
from opbench.studies.verify import BEST, verify
from opbench.tracking import Recorder
from opbench.workloads import parse_workload

WORKLOADS = ("matmul-512", "resnet50-c2", "bert-base-ffn1")
PEAK_DTYPES = ("float32", "int8", "bfloat16")  # the dtypes whose peak the host measures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), metavar="W")
    parser.add_argument("--storage", help="Optuna storage (default: a journal file in a scratch folder)")
    args = parser.parse_args()
    resources = Resources(args.threads)
    ceiling, library = gemm_ceiling(args.threads)
    scratch = tempfile.mkdtemp()
    storage, tracking = args.storage or default_storage(Path(scratch)), f"sqlite:///{scratch}/mlflow.db"
    rows, overhead_rows, notes, peaks = [], [], [], []
    with Measurer(MeasureOptions(build_workers=2)) as measurer:
        measurer.warm_up(resources)
        for name in args.workloads:
            workload = parse_workload(name)
            refs = measure_references(measurer, workload, resources, lambda r: None)
            template = get_template(workload)
            engine = OptunaEngine(template.search_space(workload), args.threads, name, storage, seed=0,
                                  budget=args.trials)
            with Recorder(f"bench-{name}", tracking, background_lock=HostLock(measurer.options.lock_path)) as recorder:
                started = time.perf_counter()
                print(f"--- {name}: {args.trials} trials", flush=True)  # progress, as `opbench tune` prints it
                records = run_tuning(engine, workload, args.trials, measurer, tee(recorder, TrialPrinter(args.trials)),
                                     resources, fresh=True)  # as tune runs it
                wall = time.perf_counter() - started
            work = sum(r.get("build_s", 0.0) + r.get("run_s", 0.0) for r in records)
            waits = sum(r.get("host_wait_s", 0.0) for r in records)
            overhead_rows.append((name, len(records), wall, 60 * len(records) / wall, 100 * (wall - work - waits) / wall,
                                  100 * waits / wall))
            verified = verify(measurer, [*refs.values(), *records], name)
            reference = library_references(workload, resources)[0]  # torch; int8: ONNX Runtime
            failed = refs[reference].get("error", "") if refs[reference]["status"] != "ok" else ""
            if failed:
                notes.append(f"{name}: {reference} {refs[reference]['status']}: {failed[:200]}")
            peak = measurer.peak_gflops(resources, workload.dtype) if workload.dtype in PEAK_DTYPES else None
            for label, schedule in verified.schedules.items():
                lat, vs_library = schedule.latency, verified.ratio(label, reference)
                shown = f"optuna best of {args.trials}" if label == BEST else label
                if lat is None:
                    rows.append((name, workload.dtype, shown, "not verified", "-", "-", reference, "-", "-", "-"))
                    continue
                gflops = workload.flops / (lat.median * 1e-3) / 1e9
                ratio = "not verified" if vs_library is None else f"{vs_library.median:.3g} ({vs_library.lo:.3g}-{vs_library.hi:.3g})"
                share = 100 * gflops / ceiling if workload.dtype == "float32" else "-"  # the ceiling is fp32's
                rows.append((name, workload.dtype, shown, lat.median, f"{lat.lo:.4g}-{lat.hi:.4g}", gflops, reference, ratio,
                             share, "-" if peak is None else f"{100 * gflops / peak:.1f}"))
            peaks.append(f"{workload.dtype}: {'none measured' if peak is None else f'{peak:.1f} GOP/s'}")
    results = Results("ops_vs_libraries")
    results.print(f"{args.threads} threads; {ceiling_line(ceiling, library)}; GFLOP/s count the direct algorithm's "
                  "FLOPs, which a Winograd convolution does fewer of (its GFLOP/s are effective ones); % peak: of the "
                  f"host's measured peak of the dtype (opbench.hardware.peak; {', '.join(dict.fromkeys(peaks))})")
    results.table(table(rows, ["workload", "dtype", "schedule", "verified ms", "min-max", "GFLOP/s", "library",
                               "x library (min-max)", "% GEMM ceiling", "% peak"]))
    results.print("".join(f"\n{note}" for note in notes))
    results.table(table(overhead_rows, ["workload", "trials", "wall_s", "trials/min", "overhead %", "host probes+waits %"]))
    results.save()

if __name__ == "__main__":
    main()
