"""What the commands share: usage errors, the measurement flags and the options and resources they give."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import TYPE_CHECKING

from opbench import settings
from opbench.argtypes import positive_float, positive_int
from opbench.cli import remote as cli_remote
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores

if TYPE_CHECKING:
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions


class UsageError(OpBenchError):
    """Malformed command-line input."""


def invoked_as() -> str:
    """The command as the user can type it again: its name where the PATH finds this one, else the path they
    gave (``.venv/bin/opbench``)."""
    name = os.path.basename(sys.argv[0])
    found = shutil.which(name)
    return name if found and os.path.exists(sys.argv[0]) and os.path.samefile(found, sys.argv[0]) else sys.argv[0]


class Parser(argparse.ArgumentParser):
    """An argument parser that takes flags as spelled, never by a prefix: a renamed flag's old name must fail
    rather than become the new one that starts with it (``--batch`` is not ``--batch-size``). Its subparsers
    are of the same class."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def add_renamed_flag(p: argparse.ArgumentParser, old: str, why: str) -> None:
    """Make ``old`` a usage error (exit 2) that says which flags replaced it."""

    class Renamed(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
            parser.error(f"{old} is gone: {why}")

    p.add_argument(old, nargs="?", action=Renamed, help=argparse.SUPPRESS)


BATCH_RENAMED = "--batch-size is a model's batch size, --configs-per-step the configs tune proposes per step"


def measure_options(args: argparse.Namespace) -> MeasureOptions:
    from opbench.measure.types import MeasureOptions

    remote = {"remote_workers": args.remote_workers, "connect_timeout_s": args.connect_timeout} \
        if hasattr(args, "remote_workers") else {}
    return MeasureOptions(timing_of(args, args.cache_flush), build_timeout_s=args.build_timeout,
                          run_timeout_s=args.run_timeout, max_workspace=args.max_workspace, **remote)


def timing_of(args: argparse.Namespace, cache_flush: bool = False) -> TimingPolicy:
    """The timing policy of :func:`add_series_flags`' flags."""
    from opbench.measure.timing import TimingPolicy

    if args.max_placements < args.placements:
        raise UsageError(f"--max-placements {args.max_placements} is below --placements {args.placements}")
    return TimingPolicy(repeat=args.repeat, cache_flush=cache_flush, placements=args.placements,
                        max_placements=args.max_placements, agree=args.agree)


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
    add_series_flags(p)
    p.add_argument("--cache-flush", action="store_true",
                   help="cold cache state: every input but the activation evicted before each call, as inside a model "
                        "(record: cache_state cold)")
    p.add_argument("--max-workspace", type=positive_int, metavar="BYTES",
                   help="a config whose schedule allocates more workspace than this is an invalid_config record, not built")
    p.add_argument("--build-timeout", type=positive_float, default=settings.BUILD_TIMEOUT_S)
    p.add_argument("--run-timeout", type=positive_float, default=settings.RUN_TIMEOUT_S)
    p.add_argument("--log", help="also append records to this JSON-lines file")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite store in mlflow/)")


def add_series_flags(p: argparse.ArgumentParser) -> None:
    """--repeat, --placements, --max-placements and --agree: how many times each run is timed."""
    p.add_argument("--repeat", type=positive_int, default=settings.REPEAT,
                   help=f"timed repeats of each placement (each >= 50 ms; default {settings.REPEAT})")
    p.add_argument("--placements", type=positive_int, default=settings.placements(),
                   help="independent placements each trial takes at least: a process forked for each, with its own "
                        f"arguments (default {settings.PLACEMENTS}, or $OPBENCH_PLACEMENTS; "
                        "docs/measurement.md#placements)")
    p.add_argument("--max-placements", type=positive_int, default=settings.max_placements(),
                   help="more placements, up to this many, until the two fastest agree "
                        f"(default {settings.MAX_PLACEMENTS}, or $OPBENCH_MAX_PLACEMENTS)")
    p.add_argument("--agree", type=positive_float, default=settings.AGREE,
                   help=f"placements within this fraction of the fastest agree (default {settings.AGREE})")
