"""The AMX templates (opbench.space.amx): their kernel built into the code for any CPU with tiles, int8 exact and bf16
within its tolerance where this host has them, every sampled point valid, the default for whole tiles only."""
import numpy as np
import pytest

from opbench.exceptions import WorkloadError
from opbench.hardware.cpu_shape import CpuShape, shaped_for
from opbench.hardware.resources import host_facts
from opbench.space import get_template
from opbench.space.amx import AMX_FLAG, PRODUCT
from opbench.testing import template_contract
from opbench.workloads import parse_workload

AMX_CPU = CpuShape(512, 32, isa=frozenset({"avx512f", "avx512_vnni", "avx512_bf16", AMX_FLAG}))
# (a config beside the default: one tile of rows by two of columns, two calls along the reduction)
PRODUCTS = {"dense:m=32,n=48,k=256,bias=1": {"block": "1x1", "k_chunk": 128},
            "matmul:m=48,n=32,k=128": {"block": "1x2", "k_chunk": 64, "rows_outer": 1}}
on_amx = pytest.mark.skipif(AMX_FLAG not in host_facts().isa, reason="this CPU has no AMX tiles")


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
@pytest.mark.parametrize("spec", list(PRODUCTS))
def test_the_tile_kernel_builds_for_a_cpu_with_tiles_and_runs_correctly_where_the_host_has_them(spec, dtype):
    import tvm

    workload = parse_workload(f"{spec},dtype={dtype}")
    with shaped_for(AMX_CPU):
        template = get_template(workload)
        assert template.name == f"{workload.op.name}_amx_{'int8' if dtype == 'int8' else 'bf16'}"
        config = template.validate(PRODUCTS[spec], workload)
        lib = tvm.compile(template.schedule(workload, config),
                          target=tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assembly = lib.mod.inspect_source("asm")
    assert PRODUCT[workload.dtype] in assembly and "ldtilecfg" in assembly
    if AMX_FLAG not in host_facts().isa:
        return  # built for a CPU this host is not
    inputs = workload.make_inputs()
    expected = workload.reference(inputs)
    args = [tvm.runtime.tensor(a) for a in [*inputs, np.zeros_like(expected)]]
    lib(*args)
    np.testing.assert_allclose(args[-1].numpy(), expected, *workload.tolerance())  # int8: (0, 0), exactly


@on_amx
@pytest.mark.parametrize("spec", ["dense:m=32,n=32,k=128,bias=1,dtype=int8", "matmul:m=16,n=64,k=64,dtype=bfloat16"])
def test_sampled_points_of_the_amx_templates_keep_the_template_contract(build_checker, spec):
    workload = parse_workload(spec)
    template = get_template(workload)
    assert "_amx_" in template.name
    template_contract.check_space(template, workload, samples=8)
    template_contract.check_builds_correct_kernels(build_checker, template, workload, samples=3)


def test_amx_is_the_default_for_whole_tiles_on_a_cpu_with_them_and_refused_saying_why_elsewhere():
    with shaped_for(AMX_CPU):
        assert get_template(parse_workload("dense:m=16,n=16,k=64,dtype=int8")).name == "dense_amx_int8"
        assert get_template(parse_workload("dense:m=16,n=16,k=32,dtype=bfloat16")).name == "dense_amx_bf16"
        assert get_template(parse_workload("dense:m=8,n=16,k=64,dtype=int8")).name == "dense_int8"  # half a tile
        assert get_template(parse_workload("dense:m=16,n=16,k=32,dtype=int8")).name == "dense_int8"  # half a row
        with pytest.raises(WorkloadError, match="m and n multiples of 16 and k of 64, not m=8, n=16, k=64"):
            get_template(parse_workload("dense:m=8,n=16,k=64,dtype=int8"), "dense_amx_int8")
        with pytest.raises(WorkloadError, match="dtype=bfloat16 only, not int8"):
            get_template(parse_workload("dense:m=16,n=16,k=64,dtype=int8"), "dense_amx_bf16")
    with shaped_for(CpuShape(512, 32, isa=frozenset({"avx512f", "avx512_vnni"}))):
        assert get_template(parse_workload("dense:m=16,n=16,k=64,dtype=int8")).name == "dense_int8"
        with pytest.raises(WorkloadError, match="the CPU has no AMX tiles"):
            get_template(parse_workload("dense:m=16,n=16,k=64,dtype=int8"), "dense_amx_int8")


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_the_peak_of_a_cpu_with_tiles_is_the_tiles_own_every_one_in_its_register(dtype):
    import tvm

    from opbench.space.amx import PEAK_ROUNDS, peak_work
    from opbench.space.peak_units import peak_of

    peak = peak_of(dtype, {"avx512f", "avx512_vnni", "avx512_bf16", AMX_FLAG}, 2)
    assert peak is not None and peak.work == peak_work(dtype, 2)
    assert peak_of(dtype, {"avx512f", "avx512_vnni", "avx512_bf16"}, 2).work < peak.work / 20  # per call, not per s
    lib = tvm.compile(tvm.IRModule({"main": peak.build()}), tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assembly = lib.mod.inspect_source("asm")
    assert assembly.count(f"\t{PRODUCT[dtype]}\t") == 4 * PEAK_ROUNDS  # every round's product an instruction
    assert assembly.count("\ttileloadd") == 8 and assembly.count("\ttilestored") == 4  # no tile spilled


@on_amx
def test_a_model_operator_on_tiles_is_timed_alone_with_the_kernel_it_links_in(measurer):
    import math

    from opbench.hardware.resources import Resources
    from opbench.hardware.targets import make_target

    workload = parse_workload("dense:m=32,n=32,k=128,bias=1,dtype=int8")
    template = get_template(workload)
    func = template.schedule(workload, template.default_config(workload))["main"]  # as model-ops times an operator
    assert math.isfinite(measurer.time_primfunc(func, make_target("llvm", 1), Resources(1)))
