"""The dot-product templates (opbench.space.dot_product): int8 exact on full-range inputs with each instruction, bf16 within
its tolerance, the instruction in the assembly, the default for int8 and bf16 matrix products where the CPU has one, refused
with a reason elsewhere."""
import contextlib
import random

import numpy as np
import pytest

from opbench.exceptions import WorkloadError
from opbench.hardware.cpu_shape import CpuShape, shaped_for
from opbench.hardware.resources import host_facts
from opbench.space import get_template
from opbench.space.dot_product import AVX2, AVX512_BF16, VNNI
from opbench.workloads import parse_workload

# an LLVM CPU with each instruction, to build for whether or not this host has it
CPUS = {VNNI.isa: ("cascadelake", "vpdpbusd"), AVX2.isa: ("haswell", "vpmaddwd"),
        AVX512_BF16.isa: ("cooperlake", "vdpbf16ps")}


# (configs beside the default: a 2-row tile; a convolution's 2 vectors of output channels, its window unrolled)
PRODUCTS = {"dense:m=8,n=32,k=48,bias=1": {"row_block": 2}, "matmul:m=6,n=48,k=20": {"row_block": 2},
            "conv2d:n=1,c=12,h=9,w=7,k=32,r=3,s=3,stride=2,pad=1": {"oc_block": 32, "ic_block": 4, "unroll_window": 1,
                                                                    "packed_output": 1}}


@pytest.mark.parametrize("dot", [VNNI, AVX2, AVX512_BF16], ids=lambda d: d.isa)
@pytest.mark.parametrize("spec", list(PRODUCTS))
def test_each_instruction_builds_into_the_kernel_and_runs_exactly_where_the_host_has_it(dot, spec):
    import tvm

    workload = parse_workload(f"{spec},dtype={dot.dtype}")
    mcpu, mnemonic = CPUS[dot.isa]
    with shaped_for(CpuShape(256 if dot is AVX2 else 512, 16 if dot is AVX2 else 32, isa=frozenset({dot.isa}))):
        template = get_template(workload)
        assert template.dtype == dot.dtype  # type: ignore[attr-defined]
        config = template.validate(PRODUCTS[spec], workload)
        assert template.nest(config, workload).vector == dot.lanes
        lib = tvm.compile(template.schedule(workload, config), target=tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    assert mnemonic in lib.mod.inspect_source("asm")
    if dot.isa not in host_facts().isa:
        return  # built for a CPU this host is not
    inputs = workload.make_inputs()
    expected = workload.reference(inputs)
    device = tvm.cpu()
    args = [tvm.runtime.tensor(a, device) for a in [*inputs, np.zeros_like(expected)]]
    lib(*args)
    if dot is AVX512_BF16:  # bf16 products summed in fp32: the order of the sums differs from the reference's
        np.testing.assert_allclose(args[-1].numpy(), expected, *workload.tolerance())
        return
    assert inputs[0].max() > 250 and inputs[1].min() < -120  # full range: vpmaddubsw would saturate here
    assert np.array_equal(args[-1].numpy(), expected)


def test_int8_matrix_products_default_to_the_dot_templates_and_others_are_refused_saying_why():
    avx2 = CpuShape(256, 16, isa=frozenset({"avx2"}))
    with shaped_for(avx2):
        assert get_template(parse_workload("dense:m=4,n=32,k=8,dtype=int8")).name == "dense_int8"
        with shaped_for(CpuShape(256, 16, isa=frozenset())):  # no instruction: the shape in force decides
            assert get_template(parse_workload("dense:m=4,n=32,k=8,dtype=int8")).name == "dense"
        assert get_template(parse_workload("matmul:m=4,n=32,k=8,dtype=int8")).name == "matmul_int8"
        assert get_template(parse_workload("dense:m=4,n=32,k=8")).name == "dense"  # fp32: the tiled template
        assert get_template(parse_workload("dense:m=4,n=24,k=8,dtype=int8")).name == "dense"  # 24 columns: not whole units
        with pytest.raises(WorkloadError, match="n a multiple of 16 and k of 4, not n=24"):
            get_template(parse_workload("dense:m=4,n=24,k=8,dtype=int8"), "dense_int8")
        with pytest.raises(WorkloadError, match="dtype=int8 only, not float32"):
            get_template(parse_workload("dense:m=4,n=32,k=8"), "dense_int8")
        conv = "conv2d:n=1,c={c},h=8,w=8,k=32,r=3,s=3,pad=1,dtype=int8"
        assert get_template(parse_workload(conv.format(c=8))).name == "conv2d_nchwc_int8"
        assert get_template(parse_workload(conv.format(c=3))).name == "conv2d_nchwc"  # an image's 3 channels: widened
        with pytest.raises(WorkloadError, match="output channels a multiple of 16 and input channels of 4, not 32 and 3"):
            get_template(parse_workload(conv.format(c=3)), "conv2d_nchwc_int8")
    with shaped_for(CpuShape(512, 32, isa=frozenset({"avx512f", "avx512_bf16"}))):
        assert get_template(parse_workload("dense:m=4,n=32,k=8,dtype=bfloat16")).name == "dense_bf16"
        assert get_template(parse_workload("conv2d:n=1,c=8,h=8,w=8,k=32,r=3,s=3,dtype=bfloat16")).name == "conv2d_nchwc_bf16"
        assert get_template(parse_workload("dense:m=4,n=32,k=8,dtype=int8")).name == "dense"  # no int8 instruction
    with shaped_for(avx2), pytest.raises(WorkloadError, match="the CPU has none of avx512_bf16"):
        get_template(parse_workload("dense:m=4,n=32,k=8,dtype=bfloat16"), "dense_bf16")
    assert get_template(parse_workload("dense:m=4,n=32,k=8,dtype=int8"), target="rpi4").name == "dense"  # an Arm board
    for shaped in (shaped_for("rpi4"), contextlib.nullcontext()):  # the board's CPU, whichever CPU runs this
        with shaped, pytest.raises(WorkloadError, match="the CPU has none of avx512_vnni, avx2"):
            get_template(parse_workload("dense:m=4,n=32,k=8,dtype=int8"), "dense_int8", target="rpi4")


def test_tvms_own_vnni_intrinsic_builds_once_repaired_as_metaschedule_uses_it():
    import tvm
    from tvm import s_tir, te

    from opbench._tvm_compat import light_tensor_intrin
    from opbench.space.dot_product import register, repair_tvm_vnni

    light_tensor_intrin()
    from tvm.s_tir.tensor_intrin import x86
    from tvm.s_tir.tensor_intrin.x86 import VNNI_DOT_16x4_INTRIN

    def tensorized() -> tvm.IRModule:
        x = te.placeholder((4, 8), "uint8", name="X")
        w = te.placeholder((1, 2, 16, 4), "int8", name="W")  # packed as MetaSchedule's rule packs it
        k = te.reduce_axis((0, 8), name="k")
        y = te.compute((4, 16), lambda i, j: te.sum(x[i, k].astype("int32") * w[0, k // 4, j, k % 4].astype("int32"),
                                                    axis=k), name="Y")
        sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, w, y])}))
        block = sch.get_sblock("Y")
        i, j, k_loop = sch.get_loops(block)
        outer, inner = sch.split(k_loop, [None, 4])
        sch.reorder(i, outer, j, inner)
        sch.decompose_reduction(block, outer)
        sch.tensorize(j, VNNI_DOT_16x4_INTRIN)
        return sch.mod

    cascadelake = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"})
    s_tir.TensorIntrin.register(VNNI_DOT_16x4_INTRIN, x86.dot_product_16x4_u8i8i32_desc,
                                x86.dot_product_16x4_u8i8i32_vnni, override=True)  # as TVM 0.27 ships it
    with pytest.raises(Exception, match="vpdpbusd"):  # i32 vectors where its LLVM takes i8 ones
        tvm.compile(tensorized(), target=cascadelake)
    register.cache_clear()  # (a module imported before may have repaired it in this process)
    repair_tvm_vnni()
    assert "vpdpbusd" in tvm.compile(tensorized(), target=cascadelake).mod.inspect_source("asm")


# The int8 convolution template on odd shapes: a 1x1, a batch of 2 with channels of 5 groups, stride 2 on an odd size.
DOT_CONVS = ["conv2d:n=1,c=8,h=7,w=7,k=16,r=1,s=1,dtype=int8", "conv2d:n=2,c=20,h=9,w=11,k=48,r=3,s=3,pad=1,dtype=int8",
             "conv2d:n=1,c=16,h=15,w=15,k=32,r=3,s=3,stride=2,pad=1,dtype=int8"]


@pytest.mark.slow
def test_sampled_points_of_the_int8_convolution_template_are_exact(build_checker):
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec

    from .kernels import failures

    if get_template(parse_workload(DOT_CONVS[0])).name != "conv2d_nchwc_int8":
        pytest.skip("this CPU has no int8 dot-product instruction (its builds are checked in the test above)")
    rng = random.Random(0)
    specs = []
    for name in DOT_CONVS:
        workload = parse_workload(name)
        knobs = get_template(workload).knobs(workload)
        configs = [{}, *({k.name: rng.choice(k.choices) for k in knobs} for _ in range(5))]
        specs += [TrialSpec(workload, config, Resources(1 + i % 2), "conv2d_nchwc_int8") for i, config in enumerate(configs)]
    records = build_checker.measure_batch(specs)
    assert not failures(records), failures(records)[:3]
    assert len({str(sorted(r.knobs.items())) for r in records}) > len(DOT_CONVS) * 4  # the points differ
