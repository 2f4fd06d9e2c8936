"""Features of a CPU kernel's compiled x86 assembly: what LLVM made of the schedule.

The nest features describe the nest as scheduled; LLVM then vectorises, unrolls and spills as it sees fit
(docs/workloads-and-templates.md#nest). These read the instructions it emitted. The assembly is cut into
basic blocks at its labels, a block's loop depth is the number of backward jumps that span it, and each
block's counts are weighted by ``LOOP_WEIGHT ** depth``, so an inner loop outweighs the code around it as it
outweighs it in the run time. Counted per floating-point arithmetic instruction (add, sub, mul, FMA): the
lanes it computes (an FMA counts twice), the shares of FMAs and of scalar ones, vector moves to and from the
stack (spills) and from other memory, shuffles and gathers.
"""
from __future__ import annotations

import contextlib
import math
import re
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opbench.exceptions import ConfigError
from opbench.space import Config, Template
from opbench.workloads import Workload

LOOP_WEIGHT = 8  # a loop body's weight over the code around it (flat counts ranked held-out workloads worse)
ASSEMBLY_FEATURES = ("asm_log_instructions", "asm_log_fp", "asm_lanes_per_fp", "asm_fma_share", "asm_scalar_share",
                     "asm_spills_per_fp", "asm_memory_moves_per_fp", "asm_shuffles_per_fp", "asm_gathers_per_fp",
                     "asm_fp_loop_depth")

_FMA = re.compile(r"^v?f(n)?m(add|sub)\d*(p|s)(s|d)$")
_ARITH = re.compile(r"^v?(mul|add|sub)(p|s)(s|d)$")
_SHUFFLE = re.compile(r"^v(perm|shuf|insert|extract|punpck|unpck|blend|pshuf|movsh|movsl|align)")
_VECTOR_REGISTER = re.compile(r"%([xyz])mm\d+")
_LANES = {"x": 4, "y": 8, "z": 16}  # fp32 lanes of an xmm, ymm and zmm register
_STACK = ("(%rsp)", "(%rbp)")


def is_x86(target: Any) -> bool:
    """Whether a TVM target compiles to x86 (an ``llvm`` target for this host or an x86 triple)."""
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "") or "")
    return triple.startswith(("x86_64", "i686")) or (not triple and _host_is_x86())


def _host_is_x86() -> bool:
    import platform

    return platform.machine() in ("x86_64", "AMD64", "i686")


def export_kernel(executable: Any, path: str, target: Any, fcompile: Any, with_assembly: bool) -> str:
    """Export a compiled kernel to the shared library ``path`` (``fcompile``: ``export_library``'s); where
    ``with_assembly`` and ``target`` is x86, through its assembly, which it returns (else ""). Where the host's
    assembler refuses LLVM's text, the kernel is exported as an object and its assembly printed by LLVM instead."""
    if not (with_assembly and is_x86(target)):
        executable.export_library(path, fcompile=fcompile)
        return ""
    try:
        return export_with_assembly(executable, path)
    except RuntimeError:  # tvm.support.cc's "Compilation error": an assembler older than LLVM's instructions
        executable.export_library(path, fcompile=fcompile)
        return str(executable.mod.inspect_source("asm"))


def export_with_assembly(executable: Any, path: str) -> str:
    """Export a compiled x86 host module to the shared library ``path`` through its assembly, and return that
    assembly: LLVM's back end runs once, for the library and the features alike (``inspect_source("asm")`` after
    an export would run it again). The host compiler assembles it (DWARF 5, as LLVM writes its line tables)."""
    from tvm.support import cc

    def assemble_and_link(output: str, objects: list[str], options: list[str] | None = None, **kwargs: Any) -> None:
        cc.create_shared(output, objects, [*(options or []), "-Wa,--gdwarf-5"], **kwargs)

    assemble_and_link.object_format = "s"  # type: ignore[attr-defined]  # export_library writes lib0.s, not lib0.o
    with tempfile.TemporaryDirectory() as work:
        executable.export_library(path, fcompile=assemble_and_link, workspace_dir=work)
        return Path(work, "lib0.s").read_text()


def record_assembly_features(record: Mapping[str, Any]) -> dict[str, float]:
    """:func:`assembly_features` of a record's kernel built again from its config for the target it was built for
    (records made before they carried them: features version 2 and older); none where that target is not x86,
    or the template is unknown or no longer takes the config."""
    from opbench.hardware.cpu_shape import record_shape, shaped_for
    from opbench.measure.features import record_config
    from opbench.space import TEMPLATES
    from opbench.workloads import parse_workload

    template, target = TEMPLATES.get(record.get("template") or ""), _record_target(record)
    if template is None or target is None or not is_x86(target):
        return {}
    workload = parse_workload(record["workload"])
    with shaped_for(record_shape(record)), contextlib.suppress(ConfigError):  # the defaults completing it: that CPU's
        return config_assembly_features(workload, template, template.validate(record_config(record), workload), target)
    return {}


def config_assembly_features(workload: Workload, template: Template, config: Config, target: Any) -> dict[str, float]:
    """:func:`assembly_features` of a validated config's kernel, built for ``target`` (none where it is not x86)."""
    from opbench.measure.memory import compile_lowered, lowered
    from opbench.measure.prepack import split_prepack
    from opbench.space._schedule import WEIGHTS_PREPACKED

    if not is_x86(target):
        return {}
    mod = template.schedule(workload, config)
    if config.get("layout_transform") == WEIGHTS_PREPACKED:
        mod, _ = split_prepack(mod)
    return assembly_features(compile_lowered(lowered(mod, target), target).mod.inspect_source("asm"))


def _record_target(record: Mapping[str, Any]) -> Any:
    """The TVM target a record's kernel was built for (its ``target``); where it names none, this host's for its
    threads if its host features say this host's vectors, else None (not known)."""
    from tvm.target import Target

    from opbench.hardware.cpu_shape import CpuShape, record_shape, target_fields
    from opbench.hardware.resources import host_facts
    from opbench.hardware.targets import make_target

    fields = target_fields(record.get("target"))
    if fields:
        return Target(fields)
    same_vectors = record_shape(record).vector_bits == CpuShape.of(host_facts()).vector_bits
    return make_target("llvm", int(record["threads"])) if same_vectors else None


def assembly_features(asm: str) -> dict[str, float]:
    """The features of AT&T-syntax x86 assembly, keyed ``feat.<name>`` for the names of
    :data:`ASSEMBLY_FEATURES` (all zero where it holds no floating-point arithmetic)."""
    blocks = _basic_blocks(asm)
    depths = _loop_depths(blocks)
    counts = [_block_counts(block) for block in blocks]
    weighted: Counter[str] = Counter()
    for depth, count in zip(depths, counts):
        for key, value in count.items():
            weighted[key] += value * LOOP_WEIGHT ** depth
    fp_depths = [depth for depth, count in zip(depths, counts) if count["fp"]]
    fp = max(weighted["fp"], 1)
    values = {
        "asm_log_instructions": math.log2(weighted["instructions"] + 1),
        "asm_log_fp": math.log2(weighted["fp"] + 1),
        "asm_lanes_per_fp": weighted["lanes"] / fp,
        "asm_fma_share": weighted["fma"] / fp,
        "asm_scalar_share": weighted["scalar"] / fp,
        "asm_spills_per_fp": weighted["spills"] / fp,
        "asm_memory_moves_per_fp": weighted["memory_moves"] / fp,
        "asm_shuffles_per_fp": weighted["shuffles"] / fp,
        "asm_gathers_per_fp": weighted["gathers"] / fp,
        "asm_fp_loop_depth": float(max(fp_depths, default=0)),
    }
    return {f"feat.{name}": values[name] for name in ASSEMBLY_FEATURES}


def _basic_blocks(asm: str) -> list[list[str]]:
    """The assembly's lines, comments cut off, cut at each label (a block starts with its label line, the first
    may have none)."""
    blocks: list[list[str]] = [[]]
    for raw in asm.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.endswith(":"):
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def _loop_depths(blocks: list[list[str]]) -> list[int]:
    """Each block's loop depth: the number of jumps from it or a later block back to it or an earlier one."""
    label_at = {block[0][:-1]: i for i, block in enumerate(blocks) if block and block[0].endswith(":")}
    depths = [0] * len(blocks)
    for i, block in enumerate(blocks):
        for line in block:
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("j") and label_at.get(parts[1], i + 1) <= i:
                for k in range(label_at[parts[1]], i + 1):
                    depths[k] += 1
    return depths


def _block_counts(lines: list[str]) -> Counter[str]:
    count: Counter[str] = Counter()
    for line in lines:
        if not line or line[0] == "." or line.endswith(":"):  # directives, labels
            continue
        op = line.split()[0]
        count["instructions"] += 1
        fma = bool(_FMA.match(op))
        if fma or _ARITH.match(op):
            scalar = op[-2] == "s"
            count["fp"] += 1
            count["lanes"] += (1 if scalar else _lanes(line)) * (2 if fma else 1)
            count["fma"] += fma
            count["scalar"] += scalar
        if any(stack in line for stack in _STACK):
            count["spills"] += op.startswith("vmov")
        elif "(" in line and op.startswith(("vmov", "vbroadcast")):
            count["memory_moves"] += 1
        count["shuffles"] += bool(_SHUFFLE.match(op))
        count["gathers"] += op.startswith("vgather")
    return count


def _lanes(line: str) -> int:
    """fp32 lanes of the widest vector register an instruction names (1 where it names none)."""
    widths = _VECTOR_REGISTER.findall(line)
    return _LANES[max(widths, key="xyz".index)] if widths else 1
