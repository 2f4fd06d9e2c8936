"""Compilation targets: the host CPU, NVIDIA GPUs and board presets (ARM boards reached over RPC).

A target name is what users type (``llvm``, ``cuda``, ``cuda -arch=sm_80``, ``pynq-z2``...). Each maps
to a TVM target and, for boards, to the cross compiler that links the shared library uploaded to
the board.
"""
from __future__ import annotations

import functools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench.exceptions import ResourceError

ELF_MACHINES = {40: "ARM", 62: "x86-64", 183: "AArch64"}  # e_machine values of the ELF header
# CPU flags (/proc/cpuinfo) -> the LLVM features they give, added to the host's target: LLVM names a VM's CPU from
# its model number alone, and may name one without them (a Sapphire Rapids VM reads "rocketlake": no AVX512-BF16)
HOST_FEATURES = {"avx512_vnni": "+avx512vnni", "avx512_bf16": "+avx512bf16", "amx_tile": "+amx-tile",
                 "amx_bf16": "+amx-bf16", "amx_int8": "+amx-int8"}


@dataclass(frozen=True)
class BoardPreset:
    """An ARM board: the TVM target of its CPU and the Debian cross gcc that links for it."""

    name: str
    description: str
    triple: str
    mcpu: str
    mattr: tuple[str, ...]
    cores: int
    compiler: str  # cross gcc on PATH
    debian_package: str
    elf_machine: str  # what the linked library's ELF header must say
    float_abi: str = ""  # "hard" for armhf: the object must pass floats in VFP registers like its libc
    l1d_ways: int = 4  # its cores' L1 data cache associativity
    l2_kb: int = 512  # its L2 cache

    def tvm_target(self, threads: int) -> Any:
        from tvm.target import Target

        spec = {"kind": "llvm", "mtriple": self.triple, "mcpu": self.mcpu, "mattr": list(self.mattr),
                "num-cores": min(threads, self.cores)}
        return Target({**spec, "mfloat-abi": self.float_abi} if self.float_abi else spec)


BOARDS = {b.name: b for b in (
    BoardPreset("pynq-z2", "Xilinx PYNQ-Z2: Zynq-7020, 2x Cortex-A9 @ 650 MHz, NEON", "armv7a-linux-gnueabihf",
                "cortex-a9", ("+neon",), 2, "arm-linux-gnueabihf-gcc", "gcc-arm-linux-gnueabihf", "ARM", "hard"),
    BoardPreset("zcu104", "Xilinx ZCU104: Zynq UltraScale+ MPSoC, 4x Cortex-A53 @ 1.2 GHz", "aarch64-linux-gnu",
                "cortex-a53", ("+neon",), 4, "aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu", "AArch64", l2_kb=1024),
    BoardPreset("rpi4", "Raspberry Pi 4: BCM2711, 4x Cortex-A72 @ 1.5 GHz", "aarch64-linux-gnu",
                "cortex-a72", ("+neon",), 4, "aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu", "AArch64", l1d_ways=2,
                l2_kb=1024),
)}

_CUDA = re.compile(r"^cuda(?:\s+-arch=(sm_\d+))?$")


def check_target(name: str) -> None:
    """Raise a :class:`ResourceError` naming the choices unless ``name`` is a known target."""
    if name == "llvm" or name in BOARDS or _CUDA.match(name):
        return
    raise ResourceError(f"unknown target '{name}'; targets: llvm, cuda, cuda -arch=sm_XX, {', '.join(BOARDS)}")


def is_gpu(name: str) -> bool:
    return bool(_CUDA.match(name))


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The ISA flags /proc/cpuinfo lists for this host's x86 CPU (none where it has no such file or line)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = re.search(r"flags\s*:\s*(.*)", cpuinfo.read_text()) if cpuinfo.exists() else None
    return frozenset(flags.group(1).split()) if flags else frozenset()


def make_target(name: str, threads: int) -> Any:  # -> tvm.target.Target (imports TVM)
    """The TVM target for ``name``; the host CPU is never plain "llvm", which emits no AVX2/FMA."""
    from tvm.target import Target

    check_target(name)
    if name == "llvm":
        host = Target.from_device("cpu").export()
        features = [feature for flag, feature in HOST_FEATURES.items() if flag in cpu_flags()]
        return Target({**host, "num-cores": threads, "mattr": [*host.get("mattr", ()), *features]})
    if name in BOARDS:
        return BOARDS[name].tvm_target(threads)
    arch = _CUDA.match(name).group(1)  # type: ignore[union-attr]
    if arch:
        return Target({"kind": "cuda", "arch": arch}, host=Target.from_device("cpu"))
    return Target.from_device("cuda") if cuda_present() else Target({"kind": "cuda", "arch": "sm_80"},
                                                                      host=Target.from_device("cpu"))


def cuda_present() -> bool:
    """Whether TVM was built with CUDA and sees a GPU here."""
    import tvm

    return bool(tvm.runtime.enabled("cuda")) and tvm.cuda(0).exist


@functools.cache
def gpu_device_key() -> str:
    """The local GPU as a device key: its name and compute capability (``cuda/NVIDIA H200/9.0``)."""
    import tvm

    device = tvm.cuda(0)
    return f"cuda/{device.device_name}/{device.compute_version}"


def export_compiler(name: str) -> Any:
    """The ``fcompile`` that ``export_library`` needs for ``name``: None (the host gcc) except for boards."""
    board = BOARDS.get(name)
    if board is None:
        return None
    if shutil.which(board.compiler) is None:
        raise ResourceError(f"target '{name}' needs the cross compiler {board.compiler}: run `make cross` "
                            f"(installs Debian's {board.debian_package})")
    from tvm.support import cc

    return cc.cross_compiler(board.compiler)


def elf_machine(path: str) -> str:
    """The machine an ELF file is built for (``ARM``, ``AArch64``, ``x86-64``), read from its header."""
    with open(path, "rb") as f:
        header = f.read(20)
    if header[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    machine = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return ELF_MACHINES.get(machine, f"machine {machine}")
