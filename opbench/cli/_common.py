"""What the commands share: usage errors, the measurement flags and the options and resources they give."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from opbench import settings
from opbench.argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from opbench.cli import remote as cli_remote
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores

if TYPE_CHECKING:
    from opbench.measure.types import MeasureOptions


class UsageError(OpBenchError):
    """Malformed command-line input."""


def measure_options(args: argparse.Namespace) -> MeasureOptions:
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions

    remote = {"remote_workers": args.remote_workers, "connect_timeout_s": args.connect_timeout} \
        if hasattr(args, "remote_workers") else {}
    from_environment = {k: v for k, v in (("settle_s", args.settle_s), ("spell_reruns", args.spell_reruns))
                        if v is not None}  # else TimingPolicy reads $OPBENCH_SETTLE_S, $OPBENCH_SPELL_RERUNS
    timing = TimingPolicy(repeat=args.repeat, max_cv=args.max_cv, max_remeasures=args.max_remeasures,
                          cache_flush=args.cache_flush, turns=args.turns, **from_environment)
    return MeasureOptions(timing, build_timeout_s=args.build_timeout, run_timeout_s=args.run_timeout,
                          max_workspace=args.max_workspace, **remote)


def resources_of(args: argparse.Namespace, threads: int) -> Resources:
    return Resources(threads=threads, cores=parse_cores(args.cores), target=args.target,
                     device=cli_remote.device_of(args))


def add_measure_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="OP:key=value,... or a preset (see `opbench ops`)")
    p.add_argument("--config", help="knob values as a JSON object")
    p.add_argument("--config-file", help="file holding the config JSON")
    p.add_argument("--template", help="schedule template (default: the op's own; convolutions on CPUs: the packed "
                                      "*_nchwc; te_default = unscheduled)")
    p.add_argument("--cores", help="pin to these cores, e.g. 0,1 or 0-3")
    p.add_argument("--target", default="llvm",
                   help="llvm (host CPU), cuda, 'cuda -arch=sm_XX', or a board preset (see `opbench targets`)")
    add_timing_flags(p)
    p.add_argument("--study", help="MLflow experiment name")
    p.add_argument("--json", action="store_true", help="print the record(s) as JSON")
    cli_remote.add_device_flags(p)


def add_timing_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=positive_int, default=settings.REPEAT, help="timed repeats (each >= 50 ms)")
    p.add_argument("--max-cv", type=positive_float, default=0.05,
                   help="repeats varying more than this (std/mean) are measured again (see --max-remeasures)")
    p.add_argument("--max-remeasures", type=nonneg_int, default=2, help="extra attempts for a noisy result; the steadiest kept")
    p.add_argument("--cache-flush", action="store_true", help="evict the CPU caches before every timed call")
    p.add_argument("--settle-s", type=nonneg_float, default=None,
                   help="a trial waits up to this long for the host's usual speed (its probe within 10%%; 0: only "
                        "record host_slowness; default: $OPBENCH_SETTLE_S or 0)")
    p.add_argument("--spell-reruns", type=nonneg_int, default=None,
                   help="a run of at most 1 s that the host-speed probes before or after it found outside the "
                        "host's usual state is taken again at most this many times (default: $OPBENCH_SPELL_RERUNS or 1)")
    p.add_argument("--turns", type=positive_int, default=settings.TURNS,
                   help="the trials of a batch (--batch, or several configs) take their repeats in this many turns, "
                        "interleaved with each other's, so that a spell of the host falls on all alike (default 3)")
    p.add_argument("--max-workspace", type=positive_int, metavar="BYTES",
                   help="a config whose schedule allocates more workspace than this is an invalid_config record, not built")
    p.add_argument("--build-timeout", type=positive_float, default=settings.BUILD_TIMEOUT_S)
    p.add_argument("--run-timeout", type=positive_float, default=settings.RUN_TIMEOUT_S)
    p.add_argument("--log", help="also append records to this JSON-lines file")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite store in mlflow/)")
