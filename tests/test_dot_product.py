"""The int8 dot-product templates (opbench.space.dot_product): exact on full-range inputs with each instruction, the instruction in the assembly,
the default for int8 matrix products where the CPU has one, refused with a reason elsewhere."""
import contextlib

import numpy as np
import pytest

from opbench.exceptions import WorkloadError
from opbench.hardware.cpu_shape import CpuShape, shaped_for
from opbench.hardware.resources import host_facts
from opbench.space import get_template
from opbench.space.dot_product import AVX2, VNNI
from opbench.workloads import parse_workload

# an LLVM CPU with each instruction, to build for whether or not this host has it
CPUS = {VNNI.isa: ("cascadelake", "vpdpbusd"), AVX2.isa: ("haswell", "vpmaddwd")}


@pytest.mark.parametrize("dot", [VNNI, AVX2], ids=lambda d: d.isa)
@pytest.mark.parametrize("spec", ["dense:m=8,n=32,k=48,bias=1,dtype=int8", "matmul:m=6,n=48,k=20,dtype=int8"])
def test_each_instruction_builds_into_the_kernel_and_runs_exactly_where_the_host_has_it(dot, spec):
    import tvm

    workload = parse_workload(spec)
    mcpu, mnemonic = CPUS[dot.isa]
    with shaped_for(CpuShape(256 if dot is AVX2 else 512, 16 if dot is AVX2 else 32, isa=frozenset({dot.isa}))):
        template = get_template(workload, f"{workload.op.name}_int8")
        config = template.validate({"row_block": 2}, workload)
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
