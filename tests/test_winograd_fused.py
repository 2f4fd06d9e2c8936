"""Winograd on a model's fused 3x3 stride-1 convolutions (opbench/space/winograd_fused.py): where it is offered,
correct kernels with every kind of epilogue and register tile, its features, and a model's tuning record of it.
and a whole model built with it against PyTorch."""
from __future__ import annotations

from dataclasses import replace

import pytest

from opbench.hardware.cpu_shape import CpuShape, record_shape, shaped_for
from opbench.hardware.resources import Resources
from opbench.measure.types import TrialSpec
from opbench.space import get_template, winograd, winograd_fused
from opbench.workloads import parse_workload
from opbench.workloads.fused import model_name
from tests.kernels import failures

MODEL = "resnet-50@tiny"  # basic blocks of 16 and 32 channels at 8x8 and 4x4
BN_RELU = "fused_conv2d1_add1_relu1"  # 3x3, stride 1, pad 1: batch norm, ReLU
RESIDUAL = "fused_conv2d1_add1_add2_relu1"  # ... and the residual add before the ReLU
FOUR_BY_FOUR = "fused_conv2d3_add3_add4_relu2"  # 32 channels at 4x4: one F(4x4) tile
NOT_OFFERED = ("fused_conv2d2_add3_relu2",  # 3x3 of stride 2
               "fused_conv2d4_add3",  # 1x1 of stride 2
               "fused_conv2d_add_relu")  # the 7x7 stem


def _workload(func: str):
    return parse_workload(model_name(MODEL, func, 1, 128))


def test_winograd_is_offered_to_a_models_3x3_stride_1_convolutions_alone():
    for func in (BN_RELU, RESIDUAL, FOUR_BY_FOUR):
        workload = _workload(func)
        knobs = {k.name: k.choices for k in get_template(workload).knobs(workload)}
        assert knobs["algorithm"] == ("direct", "winograd"), func
        assert winograd.conv_shape(workload).pad == 1
    for func in NOT_OFFERED:
        workload = _workload(func)
        assert "winograd" not in {c for k in get_template(workload).knobs(workload) for c in k.choices}, func
    # each transformed weight is read once per output tile: with fewer than 16 tiles the direct one is the default
    assert winograd.tiles(winograd.conv_shape(_workload(BN_RELU)), 4) == 4
    assert get_template(_workload(BN_RELU)).default_config(_workload(BN_RELU))["algorithm"] == "direct"
    # ... and with channels too few for the GEMMs to outweigh the transforms (on a Xeon, YOLOv3-tiny's 16 -> 32 at
    # 208x208 took 3.2x the direct one's time, ResNet-50's 128 -> 128 at 28x28 0.72x; on a Zen 4, whose FMA units
    # run AVX-512 at half width, ResNet-18's 64 -> 64 at 56x56 took 0.47x)
    shape = lambda c, k, size: winograd.ConvShape(1, c, size, size, k, 1, size, size)
    convs = ((16, 32, 208), (32, 64, 104), (64, 128, 52), (64, 64, 56), (128, 128, 28), (128, 256, 26))
    for cpu, deep in ((CpuShape(512, 32), [False, False, False, False, True, True]),
                      (CpuShape(512, 32, datapath_bits=256), [False, False, True, True, True, True])):
        with shaped_for(cpu):
            assert [winograd.deep_enough(shape(c, k, size)) for c, k, size in convs] == deep
    # ... fewer where the stages run fused per block of tiles in the L2 (on the Zen 4, YOLOv3-tiny's 16 -> 32 at
    # 208x208 took 0.86x the direct one's time fused, its 3 -> 16 stem at 416x416 3.3x)
    with shaped_for(CpuShape(512, 32, datapath_bits=256)):
        assert [winograd.deep_enough(shape(c, k, size), winograd.MIN_BLOCKED_GEMM_DEPTH)
                for c, k, size in ((3, 16, 416), *convs)] == [False, True, True, True, True, True, True]


def test_a_cpu_that_runs_avx512_at_half_width_says_so():
    from opbench.hardware.resources import host_facts

    avx512 = ("avx512f", "avx2", "fma")
    widths = {cpu_id: CpuShape.of(replace(host_facts(), cpu_id=cpu_id, isa=isa)).fma_bits for cpu_id, isa in (
        ("AuthenticAMD/25.17.1", avx512), ("AuthenticAMD/26.2.1", avx512), ("GenuineIntel/6.143.8", avx512),
        ("AuthenticAMD/25.1.1", ("avx2", "fma")))}
    assert widths == {"AuthenticAMD/25.17.1": 256, "AuthenticAMD/26.2.1": 512, "GenuineIntel/6.143.8": 512,
                      "AuthenticAMD/25.1.1": 256}  # Zen 4; Zen 5 and a Xeon whole; Zen 3 has no AVX-512
    record = {"feat.avx512": 1.0, "feat.avx2": 1.0}  # a record's CPU, as its features and device key say
    assert [record_shape({**record, "device_key": f"{cpu_id}/2c/0123abcd"}).fma_bits
            for cpu_id in ("AuthenticAMD/25.17.1", "GenuineIntel/6.143.8")] == [256, 512]


def test_a_models_tuning_tries_first_the_algorithm_its_default_passed_over():
    """The default's rule (direct below :data:`winograd.MIN_FUSED_TILES` tiles or the GEMM depth) was set on one
    CPU; a model's tuning study gives its engine the default with the other algorithm before its own picks."""
    from opbench.engines.loop import enqueue_other_algorithms
    from opbench.engines.simple import RandomEngine

    for func, other in ((BN_RELU, "winograd"), (RESIDUAL, "winograd")):
        workload = _workload(func)
        template = get_template(workload)
        default = template.default_for(workload, "llvm")
        assert default["algorithm"] != other
        assert template.other_algorithms(workload, "llvm") == [{**default, "algorithm": other}]
        engine = RandomEngine(template.search_space(workload), 1, seed=0)
        enqueue_other_algorithms(engine, workload, template, Resources(1))
        first = engine.ask(1)[0]
        assert template.validate(first.config, workload) == template.validate({**default, "algorithm": other}, workload)
    for func in NOT_OFFERED[:2]:  # strided: nothing besides the direct convolution
        workload = _workload(func)
        assert get_template(workload).other_algorithms(workload, "llvm") == []


@pytest.mark.slow
def test_fused_winograd_kernels_match_the_fused_operator(build_checker):
    """Both tiles, register tiles that leave a partial step, each epilogue, the weight transformed in the operator
    or once before the timed calls: checked against the operator's unscheduled build, with the features of what
    is timed."""
    configs = [{"winograd_tile": 4, "winograd_rows": 4, "winograd_cols": 16, "winograd_reduce": 16, "winograd_in_op": 1},
               {"winograd_tile": 2, "winograd_rows": 8, "winograd_cols": 4, "winograd_reduce": 8, "winograd_in_op": 0,
                "winograd_block": 0},
               {"winograd_tile": 2, "winograd_rows": 16, "winograd_cols": 1, "winograd_reduce": 1, "winograd_in_op": 1},
               # fused per block of tiles: of one tile; of steps that leave a partial block
               {"winograd_tile": 4, "winograd_rows": 1, "winograd_cols": 16, "winograd_reduce": 8, "winograd_in_op": 0,
                "winograd_block": 1},
               {"winograd_tile": 2, "winograd_rows": 3, "winograd_cols": 8, "winograd_reduce": 16, "winograd_in_op": 0,
                "winograd_block": 4}]
    specs = []
    for index, func in enumerate((BN_RELU, RESIDUAL, FOUR_BY_FOUR)):
        workload = _workload(func)
        template = get_template(workload)
        rows = {k.name: k.choices for k in template.knobs(workload)}["winograd_rows"]
        for config in configs:
            config = {**config, "winograd_rows": max(r for r in rows if r <= config["winograd_rows"])}
            specs.append(TrialSpec(workload, template.validate({"algorithm": "winograd", **config}, workload),
                                   Resources(1 + index % 2), template.name))
    records = build_checker.measure_batch(specs)
    assert not failures(records)
    assert {r["knob.layout_transform"] for r in records} == {"weights_prepacked"}
    assert all(r["feat.ms_stores"] > 0 for r in records)
    assert [(r.get("mem.prepacked") or 0) > 0 for r in records] == [not r["knob.winograd_in_op"] for r in records]
    assert {r["knob.winograd_in_op"] for r in records} == {0, 1}
    assert {r["knob.winograd_block"] for r in records if not r["knob.winograd_in_op"]} == {0, 1, 4}


def test_a_models_weight_is_transformed_in_the_operator_where_transformed_it_outgrows_the_l2():
    """Once transformed, the weight is read whole by each call of the model; in the operator, one block's slice
    at a time. In the operator the weight's transform is paid each call, so m follows the cost model with it."""
    workload = _workload(BN_RELU)
    transformed_kb = winograd.transformed_weight_bytes(winograd.conv_shape(workload), 4) / 1024
    for l2_kb, in_op, m in ((2 * transformed_kb, 0, 4), (transformed_kb / 2, 1, 2)):
        with shaped_for(CpuShape(512, 32, 8, l2_kb)):
            config = get_template(workload).default_config(workload)
        assert (config["winograd_in_op"], config["winograd_tile"]) == (in_op, m), l2_kb
    catalogue = parse_workload("resnet50-c2")  # its own weight, transformed in the operator: no such knob
    assert "winograd_in_op" not in winograd.default_config(catalogue)
    assert winograd.default_config(catalogue)["winograd_block"] == 0
    assert "winograd_in_op" not in {k.name for k in get_template(catalogue).knobs(catalogue)}


def test_a_weight_transformed_once_goes_with_the_stages_fused_per_block_of_tiles_that_fits_the_l2():
    """Each block reads the whole transformed weight beside its own transformed input and GEMM output: the
    default fuses 2 register-tile steps of tiles, else 1, where that fits the L2; else none."""
    shape = winograd.ConvShape(1, 64, 56, 56, 64, 1, 56, 56)  # ResNet's 64 -> 64 at 56x56, F(4x4): 196 tiles
    weight, step = winograd.transformed_weight_bytes(shape, 4), 36 * 7 * (64 + 64) * 4  # a step of 7 tiles
    for l2_bytes, block in ((weight + 2 * step, 2), (weight + 2 * step - 4, 1), (weight + step - 4, 0)):
        with shaped_for(CpuShape(512, 32, 8, l2_bytes / 1024)):
            assert winograd.fused_block(shape, 4, 7) == block, l2_bytes
    with shaped_for(CpuShape(512, 32, 8, 1024)):
        config = get_template(_workload(BN_RELU)).default_config(_workload(BN_RELU))
    assert config["winograd_block"] == 2
    # the nest's parallel loop: the blocks of tiles where fused, else the output-channel blocks
    for block, in_op, parallel in ((2, 0, 1), (1, 0, 2), (0, 0, 4), (2, 1, 4)):
        fused = {**config, "winograd_tile": 2, "winograd_rows": 8, "winograd_cols": 4, "winograd_block": block,
                 "winograd_in_op": in_op}  # 16 tiles of F(2x2) at 8x8; 16 output channels, 4 a block
        assert winograd.nest(fused, _workload(BN_RELU)).parallel == parallel, (block, in_op)


def test_a_weight_larger_than_the_l2_is_transformed_once_and_read_per_block_where_many_tiles_share_it(monkeypatch):
    """Per block, each thread keeps its tiles through all the stages: the default takes it for a weight past the
    L2 where the conv has MIN_TILES_WEIGHT_ONCE tiles or more and the weight fits MAX_WEIGHT_ONCE_L2S L2s, else
    transforms the weight in the operator."""
    workload = _workload(BN_RELU)
    shape = winograd.conv_shape(workload)
    count, weight_kb = winograd.tiles(shape, 4), winograd.transformed_weight_bytes(shape, 4) / 1024
    for least, l2_kb, in_op, block in ((count, weight_kb / 2, 0, 1), (count + 1, weight_kb / 2, 1, 0),
                                       (count, weight_kb / 5, 1, 0)):
        monkeypatch.setattr(winograd, "MIN_TILES_WEIGHT_ONCE", least)
        with shaped_for(CpuShape(512, 32, 8, l2_kb)):
            config = get_template(workload).default_config(workload)
        assert (config["winograd_in_op"], config["winograd_block"]) == (in_op, block), (least, l2_kb)


def test_the_default_register_tile_takes_more_rows_where_the_tile_count_has_no_divisor_from_4_to_8():
    """YOLOv3-tiny's 64 -> 128 at 52x52: 169 tiles of F(4x4), 13 x 13; one row a step took 1.5x the time of 13."""
    config = winograd.default_config(parse_workload("conv2d:n=1,c=64,h=52,w=52,k=128,r=3,s=3,pad=1"))
    assert (config["winograd_tile"], config["winograd_rows"]) == (4, 13)
    assert winograd.default_config(parse_workload("resnet50-c2"))["winograd_rows"] == 7  # 196 tiles


def test_a_models_record_marks_the_config_and_the_model_swaps_in_the_rebuild():
    """The tuning record's trace only annotates the fused PrimFunc (a trace cannot make another algorithm); the
    model replaces what is marked by the Winograd rebuild of the same parameters, and nothing else."""
    import tvm
    import tvm_ffi
    from tvm import s_tir

    workload = _workload(RESIDUAL)
    template = get_template(workload)
    config = template.validate({"algorithm": "winograd", "winograd_tile": 2}, workload)
    func = workload.prim_func()
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    template.apply(sch, config, workload)
    marked, other = sch.mod["main"], _workload(NOT_OFFERED[0]).prim_func()
    rebuilt = winograd_fused.rebuild_marked(tvm.IRModule({"conv": marked, "other": other}))
    assert tvm_ffi.structural_equal(rebuilt["other"], other)
    assert [p.shape for p in rebuilt["conv"].params] == [p.shape for p in func.params]
    assert "batch_gemm_update" in rebuilt["conv"].script() and rebuilt["conv"].attrs["tirx.is_scheduled"]


@pytest.mark.slow
def test_a_model_built_with_winograd_matches_pytorch(tmp_path):
    """resnet-50@tiny with each convolution that offers it as Winograd from its tuning record: the marked PrimFunc
    swapped for its rebuild (epilogue included), the weight transformed at build time; at the defaults, so the 4x4
    convolution's one F(4x4) tile is fewer than its block of tiles (2 steps of 1 row)."""
    import numpy as np
    import tvm
    from tvm import relax

    from opbench.hardware.targets import make_target
    from opbench.studies.models.tuned import TunedOp, apply_database, write_database
    from opbench.workloads.models.extract import fuse, fused_ops, import_model
    from opbench.workloads.models.sources import load_model

    source = load_model(MODEL)
    mod = fuse(import_model(source))
    tuned = []
    for op in fused_ops(mod)[0]:
        workload = _workload(op.name)
        template = get_template(workload)
        if "winograd" in {c for k in template.knobs(workload) if k.name == "algorithm" for c in k.choices}:
            tuned.append(TunedOp(workload, template, template.validate({"algorithm": "winograd"}, workload), 1.0))
    assert len(tuned) >= 3
    target = make_target("llvm", 1)
    built = apply_database(mod, write_database(tmp_path, tuned, target), target)
    for op in tuned:  # rebuilt, not marked
        assert '"batch_gemm_update"' in built[f"{op.workload.params['func']}_prepacked"].script()
    vm = relax.VirtualMachine(tvm.compile(built, target), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in source.numpy_inputs()))
    np.testing.assert_allclose(out.numpy(), source.reference()[0], rtol=1e-3, atol=1e-3)


def test_a_convolution_with_no_epilogue_is_rebuilt_to_compute_the_same():
    """The anchor writes the output itself (a catalogue conv's own PrimFunc: padding, then the convolution)."""
    import numpy as np
    import tvm

    from opbench.hardware.targets import make_target
    from opbench.measure.prepack import split_prepack

    func = parse_workload("conv2d:n=1,c=16,h=8,w=8,k=16,r=3,s=3,pad=1").prim_func()
    config = {"winograd_tile": 2, "winograd_rows": 4, "winograd_cols": 16, "winograd_reduce": 16}
    split, prepack = split_prepack(winograd_fused.scheduled(func, config))
    assert prepack is not None and prepack.shape == (4, 4, 16, 16)  # (m+2)^2 transformed 16 x 16 weights
    target, device = make_target("llvm", 1), tvm.cpu()
    rng = np.random.default_rng(0)
    data, weight = (rng.random([int(d) for d in b.shape], dtype=np.float32) for b in func.params[:2])
    expected, got, packed = (tvm.runtime.tensor(np.zeros(s, np.float32), device) for s in
                             ((1, 16, 8, 8), (1, 16, 8, 8), prepack.shape))
    tvm.compile(tvm.IRModule({"main": func}), target)["main"](tvm.runtime.tensor(data), tvm.runtime.tensor(weight),
                                                              expected)
    rebuilt = tvm.compile(split, target)
    rebuilt["prepack"](tvm.runtime.tensor(weight), packed)
    rebuilt["main"](tvm.runtime.tensor(data), packed, got)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
    in_op = winograd_fused.scheduled(func, {**config, "winograd_in_op": 1})
    assert split_prepack(in_op)[1] is None  # nothing to compute before the calls
    got = tvm.runtime.tensor(np.zeros((1, 16, 8, 8), np.float32), device)
    tvm.compile(in_op, target)["main"](tvm.runtime.tensor(data), tvm.runtime.tensor(weight), got)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
