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


def fixed_layout() -> None:
    """Re-execute this process once with address-space randomisation off, so a kernel finds its stack, heap
    and libraries where every other worker's found them. Runs on where it cannot (not Linux, the kernel
    refuses, or ``OPBENCH_FIXED_LAYOUT=0``)."""
    if sys.platform != "linux" or not settings.fixed_layout():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    persona = libc.personality(QUERY)
    if persona == -1 or persona & ADDR_NO_RANDOMIZE or libc.personality(persona | ADDR_NO_RANDOMIZE) == -1:
        return
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


@functools.cache
def fixed_mmap_threshold() -> None:
    """Fix malloc's mmap threshold (glibc raises it as large blocks are freed), so a kernel's large workspace
    is mapped on its own whatever this process freed before (``OPBENCH_FIXED_LAYOUT=0``: glibc's way). For
    processes that time kernels only: code that allocates large blocks on every call (PyTorch eager) would
    map and fault them in each time. Once per process."""
    if sys.platform == "linux" and settings.fixed_layout():
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
