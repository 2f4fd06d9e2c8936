"""``opbench dataset collect``: random-search trials of the collection's workloads on this host into the open
dataset (:mod:`opbench.tracking.dataset.open_dataset`) until a time budget is spent. Each workload is topped up
to its trials a chunk at a time, in turn, so a collection stopped (by its budget, or killed) resumes where it was,
and what a killed one measured is compacted in first."""
from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opbench.engines.loop import run_tuning
from opbench.engines.simple import RandomEngine
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.types import MeasureOptions
from opbench.record import TrialRecord
from opbench.space import get_template
from opbench.studies.collection_workloads import DEVELOPMENT, FINAL
from opbench.tracking.dataset.open_dataset import OpenDataset
from opbench.workloads import parse_workload

WORKLOADS = (*DEVELOPMENT, *FINAL)
CHUNK = 8  # trials of one workload between checks of the budget (a chunk started is finished)


@dataclass
class Collected:
    added: int  # rows new to the dataset
    trials: int  # trials run by this collection


def collect(dataset: OpenDataset, minutes: float, trials: int, threads: int, workloads: Sequence[str] = WORKLOADS,
            progress: Callable[[str], object] = print) -> Collected:
    """Up to ``trials`` random trials of each of ``workloads`` with ``threads`` threads, until ``minutes`` have
    passed; rows the dataset holds count, so a workload is only ever topped up."""
    added = dataset.compact()
    if added:
        progress(f"{added} rows a stopped collection had measured, added")
    resources = Resources(threads)
    with Measurer(MeasureOptions(build_workers=2)) as measurer:
        measurer.warm_up(resources)
        run = top_up(measurer, workloads, trials, resources, dataset.stage, dataset.counts(),
                     time.monotonic() + minutes * 60, progress)
    return Collected(added + dataset.compact(), run)


def top_up(measurer: Measurer, workloads: Sequence[str], trials: int, resources: Resources,
           sink: Callable[[TrialRecord], None], have: Mapping[str, int], deadline: float = math.inf,
           progress: Callable[[str], object] = print) -> int:
    """Random trials of the workloads until each has ``trials`` (``have`` counts what it had), a chunk of each in
    turn (so a budget spent early still covers every kind), starting none after ``deadline`` (monotonic
    seconds); each record to ``sink``. How many trials ran."""
    parsed = [parse_workload(name) for name in workloads]
    left = {w.name: trials - int(have.get(w.name, 0)) for w in parsed}
    run = 0
    while any(n > 0 for n in left.values()) and time.monotonic() < deadline:
        for n, workload in enumerate(parsed, start=1):
            if left[workload.name] <= 0 or time.monotonic() >= deadline:
                continue
            step = min(left[workload.name], CHUNK)
            progress(f"[{n}/{len(parsed)}] {workload.name}: {step} of {left[workload.name]} random trials left")
            seed = zlib.crc32(f"{workload.name}:{trials - left[workload.name]}".encode())  # topped up: drawn afresh
            engine = RandomEngine(get_template(workload).search_space(workload), resources.threads, seed=seed)
            run_tuning(engine, workload, step, measurer, sink, resources, batch=2)
            left[workload.name] -= step
            run += step
    return run
