"""Board presets (cross-builds), CUDA templates (codegen, PTX, runs where a GPU exists) and energy meters."""
from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest

from opbench.exceptions import ConfigError, ResourceError, WorkloadError
from opbench.hardware.energy import RaplMeter, local_meter
from opbench.hardware.targets import BOARDS, elf_machine, export_compiler, make_target
from opbench.measure.builder import LocalBuilder
from opbench.measure.protocol import BuildInput
from opbench.record import Status
from opbench.space import get_template
from opbench.space.gpu import GPU_TEMPLATES
from opbench.workloads import parse_workload

from .cli import run_cli
from .conftest import skip_unless_required

SMALL = "matmul:m=64,n=64,k=64"
# NEON float multiplies in the disassembly: 4-lane q registers on ARMv7 (the A9 has no FMA), v.4s on AArch64.
NEON = {"ARM": re.compile(r"\bv(?:mla|fma|mul)\.f32\s+q\d"), "AArch64": re.compile(r"\bf(?:mla|mul)\s+v\d+\.4s")}


def _require_cross(board):
    if shutil.which(board.compiler) is None:
        skip_unless_required("CROSS", f"{board.compiler} is missing: run `make cross`")


@pytest.fixture(scope="module")
def builder():
    b = LocalBuilder(workers=2)
    yield b
    b.close()


def test_each_board_preset_cross_builds_a_shared_library_for_its_machine(builder, tmp_path):
    workload = parse_workload(SMALL)
    config = get_template(workload).default_config(workload)
    for board in BOARDS.values():
        _require_cross(board)
    builds = builder.build([BuildInput(workload.spec, "matmul", config, name, 2, str(tmp_path)) for name in BOARDS])
    for board, build in zip(BOARDS.values(), builds):
        assert build.status is Status.OK, (board.name, build.error)
        assert elf_machine(build.artifact) == board.elf_machine
        assert f'"mcpu":"{board.mcpu}"' in build.target
        objdump = board.compiler.replace("-gcc", "-objdump")
        disassembly = subprocess.run([objdump, "-d", build.artifact], capture_output=True, text=True, check=True).stdout
        assert NEON[board.elf_machine].search(disassembly), f"{board.name}: no NEON float multiply in the kernel"


def test_a_missing_cross_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ResourceError, match=r"needs the cross compiler arm-linux-gnueabihf-gcc: run `make cross` "
                                            r"\(installs Debian's gcc-arm-linux-gnueabihf\)"):
        export_compiler("pynq-z2")


def test_targets_lists_presets_and_unknown_targets_are_named():
    out = run_cli(*["targets"], check=True).stdout
    assert all(name in out for name in BOARDS)
    with pytest.raises(ResourceError, match="unknown target 'armv9'; targets: llvm, cuda"):
        make_target("armv9", 1)


def test_the_host_target_has_the_dot_product_features_the_cpu_reports_whatever_llvm_names_it(monkeypatch):
    from opbench.hardware import targets

    monkeypatch.setattr(targets, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert "+avx512bf16" in make_target("llvm", 2).attrs["mattr"]
    monkeypatch.setattr(targets, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert not {"+avx512bf16", "+avx512vnni"} & set(make_target("llvm", 2).attrs["mattr"])


GPU_EXAMPLES = {"matmul": "matmul-512", "batch_matmul": "bert-base-attn", "dense": "bert-base-ffn1",
                "conv2d": "resnet50-c2", "fused_matmul": "model:bert-base@tiny/fused_matmul_add2",
                "fused_conv2d": "model:resnet-50@tiny/fused_conv2d1_add1_relu1"}


@pytest.mark.parametrize("template", GPU_TEMPLATES, ids=lambda t: t.name)
def test_cuda_templates_generate_kernels_with_shared_memory_and_thread_binding(template):
    import tvm

    workload = parse_workload(GPU_EXAMPLES[template.op])
    assert get_template(workload, None, "cuda") is template
    config = template.validate({}, workload)
    threads = math.prod(template.parameters(config, workload)[f"{a}_thread"] for a in template.tiled)
    target = make_target("cuda -arch=sm_80", 1)
    source = tvm.compile(template.schedule(workload, config), target).mod.imports[0].inspect_source()
    assert f"__launch_bounds__({threads})" in source and "__shared__" in source and "threadIdx.x" in source
    plain = tvm.compile(template.schedule(workload, {**config, "shared": 0}), target).mod.imports[0].inspect_source()
    assert "__shared__" not in plain
    if shutil.which("nvcc"):
        from tvm.support import nvcc

        with target:
            ptx = nvcc.compile_cuda(source, target_format="ptx", arch="sm_80", compiler="nvcc").decode()
        assert ".entry main_kernel" in ptx and ".shared" in ptx


@pytest.mark.parametrize("op", ["fused_matmul", "fused_conv2d"])
def test_a_models_fused_operators_take_the_cuda_templates_with_their_epilogue_in_the_kernel(op):
    import random

    import tvm

    workload = parse_workload(GPU_EXAMPLES[op])
    template = get_template(workload, None, "cuda")
    assert template.name == f"cuda_{op}"
    names = [a.name for a in template.axes(workload)]
    assert names == (["i", "j", "k"] if op == "fused_matmul" else ["n", "f", "y", "x", "rc", "ry", "rx"])
    configs = [template.default_config(workload)]
    configs += [{k.name: random.Random(seed).choice(k.choices) for k in template.knobs(workload)} for seed in range(4)]
    for config in configs:  # the producers and the epilogue go into the one kernel: nothing left unscheduled
        source = tvm.compile(template.schedule(workload, template.validate(config, workload)),
                             make_target("cuda -arch=sm_90", 1)).mod.imports[0].inspect_source()
        assert source.count(" main_kernel(") == 2  # declared and defined: one kernel
    batched = parse_workload("model:bert-base@tiny/matmul1")  # attention's: heads as a batch loop
    assert [a.name for a in get_template(batched, None, "cuda").axes(batched)] == ["b0", "i", "j", "k"]
    with pytest.raises(WorkloadError, match="no CUDA template for operator 'fused_rowwise'"):
        get_template(parse_workload("model:bert-base@tiny/layer_norm"), None, "cuda")


def test_a_model_built_for_cuda_runs_the_tuned_schedules_and_dlight_elsewhere(tmp_path):
    from opbench.studies.models.gpu import build_gpu_model, gpu_tunable
    from opbench.studies.models.tune import ModelSpec
    from opbench.studies.models.tuned import TunedOp, apply_database, write_database
    from opbench.workloads.models import cache

    model = ModelSpec("bert-base@tiny")
    ops, _, mod = cache.extract(model.model, model.batch, model.seq_len)
    chosen = gpu_tunable(model, ops, "cuda")
    assert {op.name for op, _, _ in chosen} == {o.name for o in ops if o.kind == "matmul"}  # every matmul, batched too
    assert {template.name for _, _, template in chosen} == {"cuda_fused_matmul"}
    flops = [op.calls * op.flops for op, _, _ in chosen]
    assert flops == sorted(flops, reverse=True)
    tuned = []
    for _, workload, template in chosen[:2]:
        config = template.validate({**template.default_config(workload), "shared": 0}, workload)  # not dlight's
        tuned.append(TunedOp(workload, template, config, 1.0))
    target = make_target("cuda -arch=sm_90", 1)
    library, dlight = build_gpu_model(mod, tuned, target, tmp_path)
    assert library.is_file() and dlight.is_file()  # loading them takes a CUDA runtime: their sources are read here
    import tvm

    def kernels(module):
        source = tvm.compile(module, target).mod.imports[0].imports[0].inspect_source()
        return {m.group(2): (int(m.group(1)), source[m.end():source.index("}", m.end())])
                for m in re.finditer(r"void __launch_bounds__\((\d+)\) (\w+)_kernel\(", source)}

    ours = kernels(apply_database(mod, write_database(tmp_path / "database", tuned, target), target))
    theirs = kernels(mod)
    assert set(ours) == set(theirs) and len(ours) > len(tuned)  # the same fused operators
    for op in tuned:  # the tuned schedule's threads in ours, dlight's body in theirs
        name = op.workload.params["func"]
        threads = math.prod(op.template.parameters(op.config, op.workload)[f"{a}_thread"] for a in op.template.tiled)
        assert ours[name][0] == threads and ours[name] != theirs[name]
    rest = set(ours) - {op.workload.params["func"] for op in tuned}
    assert all(ours[name] == theirs[name] for name in rest)  # dlight schedules the others in both


def test_cuda_vectorised_shared_loads_reach_the_kernel():
    import tvm

    workload = parse_workload("matmul-512")
    template = get_template(workload, None, "cuda")
    for k_inner in (4, 8, 16):  # every reduction tile is a multiple of the widest load: every tile splits into loads
        config = template.validate({"vector": 4, "k_inner": k_inner}, workload)
        source = tvm.compile(template.schedule(workload, config), make_target("cuda -arch=sm_80", 1)).mod.imports[0]
        assert "float4" in source.inspect_source()
    assert template.search_space(workload)["k_inner"]["_value"] == [4, 8, 16, 32]


def test_cuda_configs_and_ops_are_checked():
    workload = parse_workload("matmul-512")
    template = get_template(workload, None, "cuda")
    conv = parse_workload("conv2d:n=1,c=16,h=32,w=32,k=64,r=3,s=3,stride=1,pad=1")
    splits = {k.name: k.choices for k in get_template(conv, None, "cuda").knobs(conv) if k.name.endswith("_split")}
    threads = [max(int(v.split("x")[1]) for v in splits[f"{a}_split"]) for a in "fyx"]
    assert math.prod(threads) <= 1024  # every point fits a block
    with pytest.raises(ConfigError, match="knob 'i_split'"):
        template.validate({"i_split": "3x32x8"}, parse_workload("matmul:m=384,n=64,k=64"))  # 32 x 8 does not divide 384
    with pytest.raises(WorkloadError, match="no CUDA template for operator 'softmax'"):
        get_template(parse_workload("bert-base-softmax"), None, "cuda")


def test_cuda_tiles_staged_in_shared_memory_fit_a_block():
    """A stride-2 convolution's input tile spans twice its output tile: the whole-map tile (the old default)
    stages 100 KB, over a block's 48 KB, and is rejected before a build; the default takes smaller tiles, and
    the kernel's shared arrays hold no more than the template counted."""
    import tvm

    from opbench.space.gpu import SHARED_BYTES

    conv = parse_workload("conv2d:n=1,c=128,h=56,w=56,k=128,r=3,s=3,stride=2,pad=1")
    template = get_template(conv, None, "cuda")
    whole = {"f_split": "128x1x1", "y_split": "1x7x4", "x_split": "1x7x4", "rc_inner": 8, "shared": 1}
    with pytest.raises(ConfigError, match=r"knob 'shared'.*take 9\d\.\d KB a block, more than its 48 KB"):
        template.validate(whole, conv)
    assert template.validate({**whole, "shared": 0}, conv)["shared"] == 0  # unstaged, it fits
    default = template.validate({}, conv)
    assert default["shared"] == 1 and default["y_split"] == "4x7x1" and 0 < template.staged_bytes(default, conv) <= SHARED_BYTES
    source = tvm.compile(template.schedule(conv, default), make_target("cuda -arch=sm_80", 1)).mod.imports[0].inspect_source()
    arrays = [int(n) for n in re.findall(r"__shared__ alignas\(\d+\) float \w+\[(\d+)\]", source)]
    assert len(arrays) == 2 and 4 * sum(arrays) <= template.staged_bytes(default, conv)


needs_gpu = pytest.mark.skipif("not __import__('opbench.hardware.targets').hardware.targets.cuda_present()",
                               reason="no CUDA GPU on this machine")


@needs_gpu
def test_cuda_kernels_run_checked_on_the_gpu(measurer):
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec

    for preset in ("matmul-512", "bert-base-attn", "bert-base-ffn1", "resnet50-c2"):
        record = measurer.measure(TrialSpec(parse_workload(preset), {}, Resources(1, target="cuda")))
        assert record["status"] == "ok", record["error"]
        assert record["template"].startswith("cuda_") and record["max_abs_err"] < 1e-2


@needs_gpu
def test_a_gpu_studys_torch_reference_runs_on_the_gpu(measurer):
    from opbench.hardware.resources import Resources
    from opbench.studies.references import measure_references

    workload = parse_workload("matmul:m=1024,n=1024,k=1024")
    refs = measure_references(measurer, workload, Resources(1, target="cuda"), lambda r: None, verified=True)
    assert set(refs) == {"template_default", "torch"}  # no numpy, no unscheduled TE on a GPU
    torch_ref = refs["torch"]
    assert torch_ref["status"] == "ok" and torch_ref["target"] == "cuda", torch_ref.get("error")
    assert torch_ref["mem.torch_allocated"] >= 4 * 1024 * 1024  # the output at least, in the GPU's allocator


def _rapl_tree(root, packages):
    for i, (energy, limit) in enumerate(packages):
        domain = root / f"intel-rapl:{i}"
        (domain / f"intel-rapl:{i}:0").mkdir(parents=True)  # a sub-domain (core): not summed again
        (domain / "energy_uj").write_text(f"{energy}\n")
        (domain / "max_energy_range_uj").write_text(f"{limit}\n")
        (domain / f"intel-rapl:{i}:0" / "energy_uj").write_text("5\n")
    return root


def test_rapl_meter_sums_packages_and_survives_a_counter_wrap(tmp_path):
    root = _rapl_tree(tmp_path, [(1_000_000, 10_000_000), (9_900_000, 10_000_000)])
    assert RaplMeter.available(root)
    meter = RaplMeter(root)
    meter.start()
    (root / "intel-rapl:0" / "energy_uj").write_text("3500000\n")  # +2.5 J
    (root / "intel-rapl:1" / "energy_uj").write_text("400000\n")  # wrapped: +0.1 J to the limit, +0.4 J after
    assert meter.stop() == pytest.approx(3.0)
    assert not RaplMeter.available(tmp_path / "absent")


def test_energy_is_absent_not_zero_without_a_meter_and_an_energy_objective_needs_one(measurer, tmp_path):
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec

    record = measurer.measure(TrialSpec(parse_workload(SMALL), {}, Resources(1)))
    assert record["status"] == "ok"
    if local_meter(gpu=False) is None:
        assert "energy_j" not in record and "power_w" not in record
        out = run_cli(*["tune", SMALL, "--verify-rounds", "0", "--objectives", "latency,energy", "--trials", "2",
                                    "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
        assert out.returncode == 2 and "energy needs a meter, and this host has none readable" in out.stderr
    else:
        assert record["energy_j"] > 0 and record["power_w"] > 0


@needs_gpu
def test_a_model_tuned_on_the_gpu_builds_and_runs_checked_against_pytorch(measurer, tmp_path):
    from opbench.studies.models.gpu import GpuModelTune, tune_model_gpu, verify_gpu_model
    from opbench.studies.models.tune import ModelSpec

    records = []
    spec = GpuModelTune(ModelSpec("bert-base@tiny"), trials_per_op=3, max_ops=2)
    built = tune_model_gpu(spec, measurer, records.append, tmp_path)
    assert len(built.rows) == 2 and built.trials == 6 == len(records)
    assert all(r["template"] == "cuda_fused_matmul" and "cuda" in r["target"] for r in records), \
        [(r["template"], r["target"]) for r in records]
    verified = verify_gpu_model(measurer, spec, built, "tuned", rounds=1)  # each build checked against PyTorch's output
    assert set(verified.schedules) == {"tuned", "TVM dlight", "torch eager"}
    assert all(s.latency is not None and not s.errors for s in verified.schedules.values()), verified.schedules


def test_tune_model_on_a_gpu_names_what_it_cannot_do():
    from opbench.hardware.targets import cuda_present

    out = run_cli("tune-model", "bert-base@tiny", "--target", "cuda", "--reuse", "--threads", "2")
    assert out.returncode == 2 and "--threads, --reuse: not for --target cuda" in out.stderr, out.stderr[-2000:]
    out = run_cli("tune-model", "bert-base@tiny", "--target", "pynq-z2")
    assert out.returncode == 2 and "CPU (llvm) or a CUDA GPU, not 'pynq-z2'" in out.stderr, out.stderr[-2000:]
    out = run_cli("tune-model", "bert-base@tiny", "--target", "cuda -arch=volta")
    assert out.returncode == 2 and "unknown target" in out.stderr
    if not cuda_present():  # where one is, test_a_model_tuned_on_the_gpu_... tunes
        out = run_cli("tune-model", "bert-base@tiny", "--target", "cuda")
        assert out.returncode == 2 and "--target cuda: no CUDA GPU visible to TVM on this machine" in out.stderr
