"""Whole models timed in fresh processes, under the host timing lock: PyTorch eager, or a built Relax
VM loaded from its exported library. A process that ran TVM kernels slowed PyTorch 10-150x here, and
a model timed in the process that built and tuned it is timed after a long warm-up nobody else gets."""
from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from opbench.measure.lock import DEFAULT_LOCK, HostLock


def in_fresh_process(fn: Callable[..., float], *args: Any, lock: HostLock | None = None) -> float:
    """``fn(*args)`` in a new (spawned) Python process that has run nothing else, holding ``lock``
    (the host timing lock by default) exclusively: no other OpBench measurement overlaps it."""
    lock = lock or HostLock(DEFAULT_LOCK)
    with lock.exclusive(), ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def torch_ms_here(name: str, batch: int, seq_len: int, threads: int, repeat: int) -> float:
    """PyTorch eager on ``name``: median ms per forward (one discarded warm-up run)."""
    from opbench.hardware.resources import Resources

    os.environ.update(Resources(threads).worker_env())  # before OpenMP starts its threads
    import torch

    from opbench.workloads.models.sources import load_model

    source = load_model(name, batch, seq_len)
    torch.set_num_threads(threads)
    times = []
    with torch.no_grad():
        for _ in range(repeat + 1):
            start = time.perf_counter()
            source.module(*source.inputs)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def export_model(mod: Any, target: Any, path: Path) -> Path:
    """Build the Relax module for ``target`` and export it as a shared library a fresh process loads."""
    import tvm

    path.parent.mkdir(parents=True, exist_ok=True)
    tvm.compile(mod, target).export_library(str(path))
    return path


def vm_ms_here(library: str, inputs: list[np.ndarray], threads: int, repeat: int) -> float:
    """A model exported by :func:`export_model`, on the Relax VM with ``threads`` threads: median ms per run."""
    from opbench.hardware.resources import Resources

    os.environ.update(Resources(threads).worker_env())  # before TVM's thread pool first starts
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), dev)
    vm.set_input("main", *[tvm.runtime.tensor(a, dev) for a in inputs])
    evaluator = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=repeat + 1, min_repeat_ms=20)
    return statistics.median(list(evaluator("main").results)[1:]) * 1e3
