"""Every worker process with the same address-space layout (docs/measurement.md#layout)."""
from __future__ import annotations

import ctypes
import functools
import os
import sys

from opbench import settings

M_MMAP_THRESHOLD = -3  # mallopt(3)'s parameter
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's initial threshold, fixed: a large block is always mapped on its own
ADDR_NO_RANDOMIZE = 0x0040000  # personality(2)'s flag: no address-space randomisation after the next exec
QUERY = 0xFFFFFFFF  # personality(2) with this argument returns the current persona unchanged
STACK_PAD, STACK_TRIES = "OPBENCH_STACK_PAD", "OPBENCH_STACK_TRIES"
STACK_DEPTH = 64 << 10  # where a worker's initial stack pointer lies below the stack's top (a multiple of it)
MAX_STACK_TRIES = 4


def fixed_layout() -> None:
    """Re-execute this process with address-space randomisation off and its arguments and environment
    padded to one size, so a kernel finds its stack (to the byte), heap and libraries where every other
    worker's found them (docs/measurement.md#layout). Runs on where it cannot (not Linux, the kernel
    refuses, or ``$OPBENCH_ISOLATION`` leaves out ``layout``)."""
    if sys.platform != "linux" or not settings.fixed_layout():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    persona = libc.personality(QUERY)
    if persona == -1:
        return
    if not persona & ADDR_NO_RANDOMIZE:
        if libc.personality(persona | ADDR_NO_RANDOMIZE) == -1:
            return
    elif (pad := _stack_padding()) is None or int(os.environ.get(STACK_TRIES, "0")) >= MAX_STACK_TRIES:
        return
    else:  # the stack starts elsewhere than in every other worker: pad the environment by the difference
        os.environ[STACK_PAD] = "x" * pad
        os.environ[STACK_TRIES] = str(int(os.environ.get(STACK_TRIES, "0")) + 1)
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _stack_padding() -> int | None:
    """The padding that puts the initial stack pointer a multiple of :data:`STACK_DEPTH` below the stack's
    top, the least one above what the arguments and environment take (None: it lies there already)."""
    depth, pad = _stack_top() - stack_start(), len(os.environ.get(STACK_PAD, ""))
    wanted = -(-(depth - pad) // STACK_DEPTH) * STACK_DEPTH
    return None if depth == wanted else max(0, pad + wanted - depth)


@functools.cache
def fixed_mmap_threshold() -> None:
    """Fix malloc's mmap threshold (glibc raises it as large blocks are freed), so a kernel's large workspace
    is mapped on its own whatever this process freed before (without the ``layout`` isolation: glibc's way). For
    processes that time kernels only: code that allocates large blocks on every call (PyTorch eager) would
    map and fault them in each time. Once per process."""
    if sys.platform == "linux" and settings.fixed_layout():
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def stack_start(pid: int | str = "self") -> int:
    """Where a process's initial stack pointer lay (``startstack`` of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[25])  # field 28; fields 1-2 precede the ")"


def _stack_top() -> int:
    """The end of this process's main stack mapping."""
    with open("/proc/self/maps") as maps:
        return next(int(line.split()[0].split("-")[1], 16) for line in maps if line.rstrip().endswith("[stack]"))
