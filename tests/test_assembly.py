"""The compiled assembly's features: read from x86 assembly, logged by the build worker, built again for older
records."""
import math

import pytest

from opbench.hardware.resources import Resources
from opbench.measure.assembly import ASSEMBLY_FEATURES, assembly_features, record_assembly_features
from opbench.measure.types import TrialSpec
from opbench.workloads import parse_workload

# An outer loop (.LBB0_1 to .LBB0_3) around an inner one (.LBB0_2): depths 0, 1, 2, 1, 0.
TWO_LOOPS = """
main:
    vxorps %ymm0, %ymm0, %ymm0
.LBB0_1:                    # outer loop
    vmovups (%rdi), %ymm1
.LBB0_2:                    # inner loop
    vfmadd231ps (%rsi), %ymm1, %ymm0
    vmovups %ymm2, -64(%rsp)
    addq $32, %rsi
    jne .LBB0_2
.LBB0_3:
    vaddss %xmm3, %xmm4, %xmm4
    jne .LBB0_1
.LBB0_4:
    vmovups %ymm0, (%rdx)
    retq
"""


def test_each_basic_block_counts_8_to_the_power_of_its_loop_depth():
    got = assembly_features(TWO_LOOPS)
    fp = 64 * 1 + 8 * 1  # the inner loop's FMA, the outer loop's scalar add
    assert got == pytest.approx({
        "feat.asm_log_instructions": math.log2(1 + 8 * 1 + 64 * 4 + 8 * 2 + 2 + 1),
        "feat.asm_log_fp": math.log2(fp + 1),
        "feat.asm_lanes_per_fp": (64 * 8 * 2 + 8 * 1) / fp,  # a ymm FMA: 8 lanes, twice
        "feat.asm_fma_share": 64 / fp,
        "feat.asm_scalar_share": 8 / fp,
        "feat.asm_spills_per_fp": 64 / fp,  # the vmovups to the stack
        "feat.asm_memory_moves_per_fp": (8 + 1) / fp,  # the outer loop's load, the store after it
        "feat.asm_shuffles_per_fp": 0.0,
        "feat.asm_gathers_per_fp": 0.0,
        "feat.asm_fp_loop_depth": 2.0,
    })
    assert list(got) == [f"feat.{name}" for name in ASSEMBLY_FEATURES]


def test_no_floating_point_arithmetic_gives_zeros_not_a_division_by_zero():
    got = assembly_features("f:\n    movq %rdi, %rax\n    retq\n")
    assert got["feat.asm_log_instructions"] == math.log2(2 + 1) and got["feat.asm_lanes_per_fp"] == got["feat.asm_fp_loop_depth"] == 0.0


def test_a_record_carries_its_kernels_assembly_and_building_its_config_again_gives_the_same(measurer):
    """What the build worker logs is what ``dataset featurize`` computes for an older record of that config."""
    workload = parse_workload("matmul:m=64,n=64,k=64")
    record = measurer.measure(TrialSpec(workload, {}, Resources(1)))
    assert record["status"] == "ok", record["error"]
    logged = {f"feat.{name}": record[f"feat.{name}"] for name in ASSEMBLY_FEATURES}
    assert logged["feat.asm_log_fp"] > 0 and logged["feat.asm_fp_loop_depth"] >= 1
    assert record_assembly_features(record) == pytest.approx(logged)


def _compiled_matmul():
    """matmul 16x16x16 with its template default, compiled for this host (x86), and its numpy check."""
    import numpy as np

    from opbench.hardware.targets import make_target
    from opbench.measure.memory import compile_lowered, lowered
    from opbench.space import get_template

    workload = parse_workload("matmul:m=16,n=16,k=16")
    template = get_template(workload, None)
    target = make_target("llvm", 1)
    executable = compile_lowered(lowered(template.schedule(workload, template.default_config(workload)), target), target)
    a, b = np.random.default_rng(0).random((2, 16, 16), dtype=np.float32)
    return executable, target, a, b


def _runs_right(path, a, b):
    import numpy as np
    import tvm

    out = tvm.runtime.tensor(np.zeros((16, 16), np.float32))
    tvm.runtime.load_module(str(path))["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return np.allclose(out.numpy(), a @ b, atol=1e-4)


def test_a_kernel_exported_through_its_assembly_runs_and_its_text_is_llvms(tmp_path):
    """One code generation serves the library and the features: the text is what LLVM prints for the kernel."""
    from opbench.measure.assembly import export_kernel

    executable, target, a, b = _compiled_matmul()
    asm = export_kernel(executable, str(tmp_path / "k.so"), target, None, with_assembly=True)
    assert asm == executable.mod.inspect_source("asm") and assembly_features(asm)["feat.asm_log_fp"] > 0
    assert _runs_right(tmp_path / "k.so", a, b)
    assert export_kernel(executable, str(tmp_path / "plain.so"), target, None, with_assembly=False) == ""
    assert _runs_right(tmp_path / "plain.so", a, b)


def test_an_assembler_that_refuses_llvms_text_falls_back_to_the_object_and_llvms_print(tmp_path, monkeypatch):
    from opbench.measure import assembly

    def refused(executable, path):
        raise RuntimeError("Compilation error: junk at end of line")

    monkeypatch.setattr(assembly, "export_with_assembly", refused)
    executable, target, a, b = _compiled_matmul()
    asm = assembly.export_kernel(executable, str(tmp_path / "k.so"), target, None, with_assembly=True)
    assert asm == executable.mod.inspect_source("asm") and _runs_right(tmp_path / "k.so", a, b)


def test_a_fused_convolution_writes_its_nchw_rows_in_vectors_not_gathers():
    """small-cnn's 3-channel 3x3 stem (its tiny variant's 8 channels do not show it), its bias and ReLU folded into
    the write-back to NCHW, at its template default: left to LLVM, that write-back was vectorised over the channels
    with gathers (VGG-16's stem ran 3.5x slower)."""
    import platform

    from opbench.hardware.targets import make_target
    from opbench.measure.memory import compile_lowered, lowered
    from opbench.space import get_template
    from opbench.workloads.models.cache import extract

    if platform.machine() != "x86_64":
        pytest.skip("x86 assembly")
    extract("small-cnn", 1, 128)
    workload = parse_workload("model:small-cnn/fused_conv2d_add_relu")
    template, target = get_template(workload, None), make_target("llvm", 1)
    executable = compile_lowered(lowered(template.schedule(workload, template.default_config(workload)), target), target)
    features = assembly_features(executable.mod.inspect_source("asm"))
    assert features["feat.asm_fma_share"] > 0 and features["feat.asm_gathers_per_fp"] == 0
