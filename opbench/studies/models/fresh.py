"""Whole models timed in fresh processes, under the host timing lock: PyTorch eager, or a built Relax
VM loaded from its exported library. A process that ran TVM kernels slowed PyTorch 10-150x here, and
a model timed in the process that built and tuned it is timed after a long warm-up nobody else gets."""
from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from opbench.hardware.lock import DEFAULT_LOCK, HostLock

WINDOW_S = 1.0  # a whole model runs for at least this long in each fresh process: its median outlasts most slow spells


def in_fresh_process(fn: Callable[..., float], *args: Any, lock: HostLock | None = None) -> float:
    """``fn(*args)`` in a new (spawned) Python process that has run nothing else, holding ``lock``
    (the host timing lock by default) exclusively: no other OpBench measurement overlaps it."""
    lock = lock or HostLock(DEFAULT_LOCK)
    with lock.exclusive(), ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def runs_for(first_run_s: float, repeat: int, window_s: float = WINDOW_S) -> int:
    """Timed runs after a warm-up run that took ``first_run_s``: ``repeat``, or more to fill ``window_s``.

    This 2-vCPU host has slow spells in which 2-thread code runs 1.3-2x slower (MobileNetV2 tuned: 8.5 ms,
    then 19 ms in the same process); a few runs (tens of ms in all) fall inside the shortest of them
    whole, a median over a second of runs does not."""
    return max(repeat, math.ceil(window_s / max(first_run_s, 1e-6)))


def torch_ms_here(name: str, batch: int, seq_len: int, threads: int, repeat: int) -> float:
    """PyTorch eager on ``name``: median ms per forward over :func:`runs_for` runs after a warm-up run."""
    from opbench.hardware.resources import Resources

    os.environ.update(Resources(threads).worker_env())  # before OpenMP starts its threads
    import torch

    from opbench.workloads.models.sources import load_model

    source = load_model(name, batch, seq_len)
    torch.set_num_threads(threads)

    def forward() -> float:
        start = time.perf_counter()
        source.module(*source.inputs)
        return time.perf_counter() - start

    with torch.no_grad():
        first = forward()
        times = [forward() for _ in range(runs_for(first, repeat))]
    return statistics.median(times) * 1e3


def export_model(mod: Any, target: Any, path: Path) -> Path:
    """Build the Relax module for ``target`` and export it as a shared library a fresh process loads."""
    import tvm

    path.parent.mkdir(parents=True, exist_ok=True)
    tvm.compile(mod, target).export_library(str(path))
    return path


def vm_ms_here(library: str, inputs: list[np.ndarray], threads: int, repeat: int) -> float:
    """A model exported by :func:`export_model`, on the Relax VM with ``threads`` threads: median ms per run
    over :func:`runs_for` runs after a warm-up run."""
    from opbench.hardware.resources import Resources

    os.environ.update(Resources(threads).worker_env())  # before TVM's thread pool first starts
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), dev)
    vm.set_input("main", *[tvm.runtime.tensor(a, dev) for a in inputs])

    def timed(runs: int) -> list[float]:
        return list(vm.time_evaluator("invoke_stateful", dev, number=1, repeat=runs)("main").results)

    first = timed(1)[0]
    return statistics.median(timed(runs_for(first, repeat))) * 1e3
