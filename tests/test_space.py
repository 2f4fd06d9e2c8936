"""Per-workload spaces: every point validates and applies (odd shapes included; on CUDA, every point whose
shared-memory tiles fit a block, the others rejected by name), the template default is a point, features
compare across workloads, bad knobs are named, and every point builds a correct kernel (a weighted sample,
built and checked)."""
import dataclasses
import itertools
import math
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest

from opbench.exceptions import ConfigError, WorkloadError
from opbench.hardware.cpu_shape import DEFAULT_L2_KB, CpuShape, current_shape, shaped_for, target_shape
from opbench.hardware.resources import HostFacts, Resources
from opbench.measure.features import config_features, nest_features
from opbench.measure.types import TrialSpec
from opbench.space import TEMPLATES, Nest, get_template, winograd
from opbench.space._base import split_factors
from opbench.space._schedule import TILE_VECTORS
from opbench.space.fused_matmul import row_padding, row_tile
from opbench.space.gpu import SHARED_BYTES, GpuTiledTemplate
from opbench.space.tiled import alias_free_rows, nest_choices
from opbench.workloads import PRESETS, parse_workload
from opbench.workloads.fused import model_name
from tests.kernels import failures

ODD_SHAPES = [  # a prime extent, a 1-sized dim, 7x7 outputs, stride 2 with padding, ...
    "matmul:m=100,n=37,k=129", "matmul:m=1,n=64,k=31", "batch_matmul:b=3,m=17,n=1,k=13", "dense:m=1,n=37,k=64,bias=1",
    "conv2d:n=1,c=64,h=30,w=30,k=64,r=3,s=3,stride=2,pad=1", "conv2d:n=1,c=32,h=7,w=7,k=32,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=3,h=17,w=17,k=5,r=3,s=3,stride=2,pad=0", "depthwise_conv2d:n=1,c=13,h=7,w=7,r=3,s=3,stride=2,pad=1",
    "pool2d:n=1,c=3,h=17,w=17,r=3,s=3,stride=2,pad=1,kind=avg", "softmax:m=7,n=37", "layer_norm:m=1,n=37",
    "add_relu:n=1,c=3,h=7,w=7", "conv3d:n=1,c=3,d=5,h=7,w=6,k=5,t=3,r=3,s=3,stride=2,pad=1",
    "conv2d_transpose:n=2,c=3,h=3,w=4,k=5,r=3,s=3,stride=3,pad=0,output_padding=2",
]
# Uniform samples per space that must validate and apply; the 1,000 with OPBENCH_SPACE_SAMPLES=1000.
SAMPLES = int(os.environ.get("OPBENCH_SPACE_SAMPLES", "25"))


PACKED = {"conv2d": "conv2d_nchwc", "depthwise_conv2d": "depthwise_conv2d_nchwc"}


def spaces():
    for name in [*PRESETS, *ODD_SHAPES]:
        w = parse_workload(name)
        yield pytest.param(w, get_template(w), id=f"{name}-cpu")
        if w.op.name in PACKED:  # the CPU default is the packed template; the tiled one is the op's own
            yield pytest.param(w, get_template(w, w.op.name), id=f"{name}-tiled")
        if f"cuda_{w.op.name}" in TEMPLATES:
            yield pytest.param(w, get_template(w, target="cuda"), id=f"{name}-cuda")


def uniform(template, workload, n, seed=0):
    rng = random.Random(seed)
    knobs = template.knobs(workload)
    return [{k.name: rng.choice(k.choices) for k in knobs} for _ in range(n)]


def apply(template, workload, config):
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": workload.prim_func()}))
    template.apply(sch, template.validate(config, workload), workload)
    return sch


@pytest.mark.parametrize(("workload", "template"), spaces())
def test_every_sampled_point_validates_and_applies(workload, template):
    default = template.default_config(workload)
    assert template.validate(default, workload) == default  # the default is a point of the space
    for config in uniform(template, workload, SAMPLES // 3 if template.name in PACKED else SAMPLES):  # tiled convs: fewer
        if isinstance(template, GpuTiledTemplate) and template.staged_bytes(config, workload) > SHARED_BYTES:
            with pytest.raises(ConfigError, match="knob 'shared': the tiles staged in shared memory take"):
                template.validate(config, workload)
        else:
            apply(template, workload, config)


def test_tiles_are_the_factorizations_of_odd_extents():
    w = parse_workload("matmul:m=100,n=37,k=129")
    knobs = {k.name: k.choices for k in get_template(w).knobs(w)}
    assert set(knobs["j_split"]) == {"37x1x1", "1x1x37"}  # 37 is prime: whole at one level (S1 tiles stop at 32)
    assert knobs["k_inner"] == (1, 3, 43)  # 129 itself is above the R1 cap of 128
    assert all(math.prod(map(int, v.split("x"))) == 100 for v in knobs["i_split"])
    conv = parse_workload("resnet50-c5")  # 7x7 output: a tile of 8 is not offered
    assert set(next(k for k in get_template(conv, "conv2d").knobs(conv) if k.name == "x_split").choices) == {"7x1x1", "1x7x1", "1x1x7"}
    assert next(k for k in get_template(conv).knobs(conv) if k.name == "ow_block").choices == (1, 7)  # packed: the same rule


def test_consumer_placements_inside_the_reduction_are_not_in_the_space():
    assert "SRSRS:inner" not in nest_choices() and "SRSSR:inner" not in nest_choices()
    assert {"SSRRS:inner", "SRSRS:outer", "SRSSR:root"} <= set(nest_choices())
    w = parse_workload("bert-base-ffn1")
    with pytest.raises(ConfigError, match="knob 'order'"):
        get_template(w).validate({"order": "SRSRS:inner"}, w)


def test_padding_knob_only_where_there_is_padding():
    padded, unpadded = parse_workload("resnet50-c2"), parse_workload("conv2d:n=1,c=8,h=8,w=8,k=8,r=1,s=1,pad=0")
    assert "pad_at" in get_template(padded, "conv2d").search_space(padded)
    assert "pad_at" not in get_template(unpadded, "conv2d").search_space(unpadded)


def test_config_features_are_tile_sizes_comparable_across_workloads():
    small, large = parse_workload("matmul:m=64,n=64,k=64"), parse_workload("matmul-512")
    a = config_features({"i_split": "16x1x4", "j_split": "4x2x8", "order": "SRSRS:outer", "k_inner": 8}, small, "matmul")
    b = config_features({"i_split": "128x1x4", "j_split": "32x2x8", "order": "SRSRS:outer", "k_inner": 8}, large, "matmul")
    assert a.keys() == b.keys() and all(a[k] == b[k] or math.isnan(a[k]) and math.isnan(b[k]) for k in a)  # same tiles, same numbers
    assert (a["feat.cfg_i_inner"], a["feat.cfg_j_mid"], a["feat.cfg_j_inner"]) == (4.0, 2.0, 8.0)
    assert a["feat.cfg_write_at"] == 1.0 and math.isnan(a["feat.cfg_inner_split"])
    unpadded = parse_workload("conv2d:n=1,c=8,h=8,w=8,k=8,r=1,s=1,pad=0")
    assert math.isnan(config_features({}, unpadded, "conv2d")["feat.cfg_pad_at"])  # no padding stage: no placement


def test_nest_features_say_the_same_of_a_matmul_and_a_conv_in_the_cpus_terms():
    """A matmul's 8 x 32 register tile and a packed conv's 1 x 8 x 32 one read alike (16 of 16 accumulators on
    AVX-512, 1.6 vector FMAs a load); a 48-wide vector is flagged, and 3 parallel blocks leave a 2nd thread idle."""
    avx512 = CpuShape(512, 32)
    matmul = nest_features(Nest((8, 32), 32, 128, 32), 2, avx512)
    conv = nest_features(Nest((1, 8, 32), 32, 144, 3), 2, avx512)
    for name in ("feat.nest_tile", "feat.nest_acc_regs", "feat.nest_vector_fill", "feat.nest_fma_per_load"):
        assert matmul[name] == conv[name], name
    assert (matmul["feat.nest_acc_regs"], matmul["feat.nest_fma_per_load"], matmul["feat.nest_vector_pow2"]) == (1.0, 1.6, 1.0)
    assert (matmul["feat.nest_parallel_balance"], conv["feat.nest_parallel_balance"]) == (1.0, 0.75)
    wide = nest_features(Nest((4, 48), 48, 8, 4), 2, avx512)
    assert (wide["feat.nest_vector_pow2"], wide["feat.nest_vector_fill"], wide["feat.nest_acc_regs"]) == (0.0, 3.0, 0.75)
    scalar = nest_features(Nest((4, 3), 0, 8, 1), 2, avx512)
    assert (scalar["feat.nest_acc_regs"], scalar["feat.nest_fma_per_load"]) == (0.75, 12 / 7)
    assert all(math.isnan(v) for v in nest_features(None, 2, avx512).values())


def test_unknown_knob_and_value_are_named():
    w = parse_workload("matmul-512")
    with pytest.raises(ConfigError) as info:
        get_template(w).validate({"tile_z": 4}, w)
    assert info.value.knob == "tile_z" and "unknown knob" in str(info.value)
    with pytest.raises(ConfigError, match="knob 'i_split'"):
        get_template(w).validate({"i_split": "3x1x1"}, w)  # not a factorization of 512


def test_generic_and_foreign_templates():
    w = parse_workload("matmul-512")
    assert get_template(w, "te_default").validate({}, w) == {}
    with pytest.raises(WorkloadError, match="does not apply"):
        get_template(w, "conv2d")
    with pytest.raises(WorkloadError, match="unknown template"):
        get_template(w, "magic")


def test_a_templates_version_covers_every_schedule_module_it_reaches():
    """A kept tuning is reused only while the schedules its configs name are unchanged: the helpers a template
    imports as modules (the packed conv's Winograd, GEMM and rows) count, and a template reaches no other's."""
    from opbench.space._base import source_files

    packed = {Path(f).name for f in source_files(type(TEMPLATES["fused_conv2d_nchwc"]))}
    assert {"packed.py", "winograd.py", "winograd_fused.py", "winograd_stages.py", "epilogue.py", "pointwise.py",
            "depthwise_rows.py", "stem_columns.py"} <= packed
    assert {Path(f).name for f in source_files(type(TEMPLATES["matmul"]))} == {"_base.py", "_schedule.py", "tiled.py"}


def test_tvm_vectorised_reduction_with_cache_copy_is_miscompiled():
    """Minimal TensorIR repro of a TVM 0.27 lowering bug (why ``vectorize_inner`` never vectorises a
    loop shared with another block): vectorising a loop around a decomposed reduction and its cache
    copy computes wrong sums. When this starts to pass, TVM is fixed; the template needs no change."""
    import tvm
    from tvm import s_tir
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def rowsum(A: T.Buffer((16, 8), "float32"), C: T.Buffer((16,), "float32")):
        for i, k in T.grid(16, 8):
            with T.sblock("C"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    C[vi] = T.float32(0)
                C[vi] = C[vi] + A[vi, vk]

    sch = s_tir.Schedule(rowsum)
    block = sch.get_sblock("C")
    copy = sch.cache_write(block, 0, "local")
    i, k = sch.get_loops(block)
    sch.reverse_compute_at(copy, i)
    sch.vectorize(i)
    sch.decompose_reduction(block, k)
    a = np.random.default_rng(0).random((16, 8), dtype="float32")
    c = tvm.runtime.tensor(np.zeros(16, "float32"))
    tvm.compile(sch.mod, target="llvm")["main"](tvm.runtime.tensor(a), c)
    assert np.abs(c.numpy() - a.sum(1)).max() > 1e-3  # TVM's bug: wrong sums (a fixed TVM fails this line)


# What decides correctness in the tiled template: every combination of these, tiles drawn at random.
CRITICAL = ("cache_write", "order", "vectorize")
BUILT_PER_KIND = int(os.environ.get("OPBENCH_BUILT_PER_KIND", "60"))
KINDS = {  # a small workload per template kind, with an epilogue or a producer where the kind has one
    "tiled": ["matmul:m=24,n=20,k=16", "dense:m=8,n=12,k=20,bias=1", "conv2d:n=1,c=4,h=7,w=7,k=6,r=3,s=3,stride=2,pad=1",
              "conv3d:n=1,c=4,d=3,h=5,w=5,k=6,t=3,r=3,s=3,pad=1", "conv2d_transpose:n=1,c=4,h=5,w=5,k=6,r=4,s=4,stride=2,pad=1"],
    "rowwise": ["softmax:m=6,n=20", "layer_norm:m=4,n=24", "add_relu:n=1,c=3,h=5,w=4"],
}
# The row-wise template's partial sums (reduce_vector, at random) are placed differently at the root and per row.
CRITICAL_OF = {"tiled": CRITICAL, "rowwise": ("compute_at", "parallel", "vectorize", "inline")}


def weighted_configs(workload, n, critical_knobs=CRITICAL, seed=0, first=0, template=None):
    """``n`` configs of ``template`` (the op's own by default): every combination of the critical knobs in turn
    (from the ``first``), the other knobs at random."""
    template = template or get_template(workload, workload.op.name)
    knobs = {k.name: k.choices for k in template.knobs(workload)}
    critical = [name for name in critical_knobs if name in knobs] or [next(iter(knobs))]
    combos = [dict(zip(critical, values)) for values in np.array(np.meshgrid(*[range(len(knobs[c])) for c in critical]))
              .reshape(len(critical), -1).T.tolist()]
    rng = random.Random(seed)
    out = []
    for index in range(n):
        config = {name: rng.choice(choices) for name, choices in knobs.items()}
        config.update({c: knobs[c][i] for c, i in combos[(first + index) % len(combos)].items()})
        out.append(config)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_point_builds_a_correct_kernel(build_checker, kind):
    specs = []
    for i, name in enumerate(KINDS[kind]):
        w = parse_workload(name)
        total = BUILT_PER_KIND if kind == "tiled" else BUILT_PER_KIND // 3  # tiled: every critical combination ...
        count = total // len(KINDS[kind]) + (i < total % len(KINDS[kind]))
        configs = weighted_configs(w, count, CRITICAL_OF[kind], first=len(specs))  # ... across its workloads, each the next
        specs += [TrialSpec(w, config, Resources(1 + index % 2), w.op.name) for index, config in enumerate(configs)]
    records = build_checker.measure_batch(specs)
    wrong = failures(records)
    assert not wrong, wrong[:3]


# Packed (NCHW[x]c) templates on odd shapes: stride 2 with padding, 7x7 outputs, channel counts the
# 16-wide default block does not divide (24, 40, 3), a prime width; the default and a tuned point each.
PACKED_ODD = ["conv2d:n=1,c=24,h=13,w=13,k=40,r=3,s=3,stride=2,pad=1", "conv2d:n=1,c=3,h=7,w=7,k=8,r=3,s=3,pad=1",
              "depthwise_conv2d:n=1,c=40,h=7,w=7,r=3,s=3,pad=1", "depthwise_conv2d:n=1,c=24,h=15,w=15,r=5,s=5,stride=2,pad=2"]
PACKED_CRITICAL = ("packed_output", "reduce_order", "unroll_window")


@pytest.mark.slow
def test_packed_templates_build_correct_kernels_on_odd_shapes(build_checker):
    specs = []
    for name in PACKED_ODD:
        w = parse_workload(name)
        template = get_template(w)
        tuned = {**weighted_configs(w, 1, PACKED_CRITICAL, first=len(specs), template=template)[0], "layout_transform": "in_op"}
        configs = [{}, tuned, {**tuned, "layout_transform": "weights_prepacked"}]  # ... and its weight packed before
        if w.op.name == "conv2d":  # the tuned point again, its weight packed the other way in the operator
            configs.append({**tuned, "weight_pack_at": "root" if tuned["weight_pack_at"] == "oc_block" else "oc_block"})
        specs += [TrialSpec(w, config, Resources(1 + index % 2), template.name) for index, config in enumerate(configs)]
    records = build_checker.measure_batch(specs)
    wrong = failures(records)
    assert not wrong, wrong[:3]
    # where the packing runs is in the record, and a prepacked weight's packing is split off (its bytes recorded)
    assert [r["knob.layout_transform"] == "weights_prepacked" for r in records] == [
        (r.get("mem.prepacked") or 0) > 0 for r in records] and len({r["knob.layout_transform"] for r in records}) == 2
    in_op_convs = [r for r in records if r["workload"].startswith("conv2d") and r["knob.layout_transform"] == "in_op"]
    assert {r["knob.weight_pack_at"] for r in in_op_convs} == {"root", "oc_block"}


@pytest.mark.slow
def test_a_convolution_of_a_prime_width_takes_column_tiles_that_do_not_divide_it(build_checker):
    """17 output columns (Inception-v3's 17x17 stage) have no divisor from 2 to 16: the packed templates (direct,
    depthwise) also take tiles of 2-8 columns, the last one predicated, and default to the one that predicates
    fewest (6: three tiles, one column idle); every such tile computes the convolution. The int8 dot-product
    template's tensorized block takes no predicate: its tiles divide the width. A width with a divisor of 3
    (SqueezeNet's 111 columns) keeps to its divisors."""
    from opbench.space.column_tiles import column_tiles

    assert column_tiles(17) == (1, 2, 3, 4, 5, 6, 7, 8) and column_tiles(14) == (1, 2, 7, 14)
    assert column_tiles(111) == (1, 3) and get_template(stem := parse_workload(
        "conv2d:n=1,c=3,h=224,w=224,k=64,r=3,s=3,stride=2")).default_config(stem)["ow_block"] == 3
    conv, depthwise = (parse_workload(name) for name in ("conv2d:n=1,c=8,h=17,w=17,k=16,r=3,s=3,pad=1",
                                                         "depthwise_conv2d:n=1,c=16,h=17,w=17,r=3,s=3,pad=1"))
    assert not TEMPLATES["conv2d_nchwc_int8"].predicated_columns and column_tiles(17, predicated=False) == (1,)
    specs = []
    for w in (conv, depthwise):
        template = get_template(w)
        assert template.default_config(w)["ow_block"] == 6
        specs += [TrialSpec(w, template.validate({"ow_block": b, "packed_output": b % 2}, w), Resources(1 + b % 2),
                            template.name) for b in column_tiles(17)]
    records = build_checker.measure_batch(specs)
    assert not failures(records), failures(records)[:3]


def test_a_model_convolution_that_pads_its_output_runs_the_padding_after_it(build_checker):
    """yolov3-tiny pads a convolution's output before its last pooling: the padding writes more than the convolution
    computes, so it cannot fold into the write; it runs as a stage of its own, after a packed or a direct write."""
    workload = parse_workload(model_name("yolov3-tiny@tiny", "fused_conv2d5_add5_leaky_relu5_pad",
                                         1, 128))
    template = get_template(workload)
    specs = [TrialSpec(workload, template.validate({"packed_output": packed}, workload), Resources(2), template.name)
             for packed in (0, 1)]
    records = build_checker.measure_batch(specs)
    assert not failures(records), failures(records)


@pytest.mark.slow
def test_a_model_matmul_of_a_prime_count_of_rows_is_padded_to_whole_register_tiles(build_checker):
    """ViT's tokens are prime (197; vit-base@tiny's 17): a matmul's rows are padded to whole register tiles of rows
    and its output copied back (through its epilogue where it has one), where perfect splits left a register tile of
    one row; with a weight (packed), between two activations (attention), and with its columns padded too (scores).
    A matmul narrower than a register tile (a GCN's 7 classes) is not: the padded copy would be most of its work."""
    wide = TILE_VECTORS * current_shape().fp32_lanes
    assert row_padding(197, wide - 1) == 0 < row_padding(197, wide) and row_padding(2704, wide) == 0
    specs = []
    for func in ("fused_matmul3_add5", "matmul2", "matmul1"):
        workload = parse_workload(model_name("vit-base@tiny", func, 1, 128))
        template = get_template(workload)
        rows = next(a.extent for a in template.axes(workload) if a.name == "i")
        assert rows % row_tile() == 0 and rows - row_tile() < 17 < rows
        choices = next(k.choices for k in template.knobs(workload) if k.name == "i_split")
        assert all(math.prod(split_factors(c)) == rows for c in choices)
        default = split_factors(template.default_config(workload)["i_split"])
        assert default[-1] > 1 and math.prod(default) == rows
        specs += [TrialSpec(workload, template.validate(config, workload), Resources(2), template.name)
                  for config in ({}, *({"i_split": c} for c in choices[::4]))]
    records = build_checker.measure_batch(specs)
    assert not failures(records), failures(records)


def test_a_plain_model_matmul_of_a_prime_count_of_columns_is_padded_to_whole_vectors(build_checker):
    """Attention's scores (Q x Kᵀ) have as many columns as tokens (17 in vit-base@tiny): the matmul is padded to whole
    register tiles and its output copied back, where perfect splits left a vector of one lane; a GCN's 7 classes to
    one vector; a matmul with other blocks, or whose columns a vector divides, is left as it is."""
    scores = parse_workload(model_name("vit-base@tiny", "matmul1", 1, 128))
    template = get_template(scores)
    columns = next(a.extent for a in template.axes(scores) if a.name == "j")
    assert columns % current_shape().fp32_lanes == 0 and columns > 17 == scores.axes[2].extent
    assert split_factors(template.default_config(scores)["j_split"])[-1] % current_shape().fp32_lanes == 0
    for func in ("matmul2", "fused_matmul3_add5"):  # 32 and 128 columns; the latter also adds a bias
        other = parse_workload(model_name("vit-base@tiny", func, 1, 128))
        assert next(a.extent for a in template.axes(other) if a.name == "j") == other.axes[-2].extent
    choices = next(k.choices for k in template.knobs(scores) if k.name == "j_split")
    specs = [TrialSpec(scores, template.validate(config, scores), Resources(2), template.name)
             for config in ({}, *({"j_split": c, "order": order} for c, order in
                                   zip(choices[::3], itertools.cycle(("SSRRS:inner", "SRSRS:root", "SSRSR:outer")))))]
    narrow = parse_workload(model_name("gcn@tiny", "matmul3", 1, 128))  # the adjacency times 7 classes: one vector
    assert next(a.extent for a in template.axes(narrow) if a.name == "j") == current_shape().fp32_lanes
    specs.append(TrialSpec(narrow, template.validate({}, narrow), Resources(2), template.name))
    records = build_checker.measure_batch(specs)
    assert not failures(records), failures(records)

# Winograd on odd shapes: a batch of 2, channel counts the vector does not divide (1 included), outputs the tiles
# overrun (9x11, 7x7), no padding; F(2x2) and F(4x4), the GEMM tile and reduction drawn at random.
WINOGRAD_ODD = ["conv2d:n=2,c=5,h=9,w=11,k=12,r=3,s=3,pad=1", "conv2d:n=1,c=16,h=8,w=8,k=32,r=3,s=3",
                "conv2d:n=1,c=3,h=7,w=7,k=8,r=3,s=3,pad=1", "conv2d:n=1,c=1,h=5,w=5,k=1,r=3,s=3",
                "conv2d:n=1,c=24,h=10,w=10,k=40,r=3,s=3,pad=1"]


@pytest.mark.slow
def test_winograd_builds_correct_kernels_on_odd_shapes(build_checker):
    specs = []
    for index, name in enumerate(WINOGRAD_ODD):
        w = parse_workload(name)
        knobs = {k.name: k.choices for k in get_template(w).knobs(w)}
        for m in (2, 4):
            rng = random.Random(10 * index + m)
            config = {"algorithm": "winograd", "winograd_tile": m,
                      **{k: rng.choice(knobs[k]) for k in ("winograd_rows", "winograd_cols", "winograd_reduce")}}
            if m == 4:  # the widest block: several vectors of output channels per block
                config["winograd_cols"] = knobs["winograd_cols"][-1]
            partial = [r for r in knobs["winograd_rows"] if m == 2 and winograd.tiles(winograd.conv_shape(w), m) % r]
            if partial:  # rows that divide only F(4x4)'s tile count: F(2x2)'s last step is partial
                config["winograd_rows"] = partial[-1]
            specs.append(TrialSpec(w, config, Resources(1 + index % 2)))
    records = build_checker.measure_batch(specs)
    wrong = failures(records, "knob.winograd")
    assert not wrong, wrong[:3]
    assert {(r["knob.algorithm"], r["knob.winograd_tile"]) for r in records} == {("winograd", 2), ("winograd", 4)}


def test_winograd_is_offered_to_catalogue_3x3_stride_1_convs_and_the_default_where_channels_fill_vectors():
    def default(name, template=None):
        w = parse_workload(name)
        return get_template(w, template).default_config(w)

    assert (default("resnet50-c2")["algorithm"], default("resnet50-c2")["winograd_tile"]) == ("winograd", 4)
    # 16 2x2 tiles, 4 of 4x4: F(4x4) would transform a 2.25x larger weight for few tiles
    assert (default("resnet50-c5")["algorithm"], default("resnet50-c5")["winograd_tile"]) == ("winograd", 2)
    assert default("conv2d:n=1,c=3,h=32,w=32,k=64,r=3,s=3,pad=1")["algorithm"] == "columns"  # 3 input channels
    for name, template in [("conv2d:n=1,c=64,h=30,w=30,k=64,r=3,s=3,stride=2,pad=1", None),
                           ("conv2d:n=1,c=8,h=14,w=14,k=8,r=5,s=5,pad=2", None),
                           ("depthwise_conv2d:n=1,c=16,h=14,w=14,r=3,s=3,pad=1", None),
                           ("conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1", "conv2d")]:  # the tiled NCHW template
        assert "winograd_tile" not in default(name, template), name  # (the depthwise conv's alternative: rows)


def test_the_fused_matmul_packs_a_weight_read_plain_or_transposed_and_no_activation():
    """``B[k, j]`` (a catalogue matmul, an ONNX MatMul on a weight) and ``W[j, k]`` (a Linear layer)
    are weights; a batched matmul's operands are activations. The plain read, packed in the operator
    or once before it (``weights_prepacked``: the packing split off), computes what the unpacked
    operator does."""
    from tvm import te

    from opbench.measure.prepack import Prepack, split_prepack
    from opbench.space._base import split_factors
    from opbench.space.fused_matmul import FusedMatmulTemplate
    from opbench.space.fused_matmul import weight_read_of as weight_read

    x, w, a = te.placeholder((8, 16), name="x"), te.placeholder((12, 16), name="w"), te.placeholder((2, 8, 16), name="a")
    k = te.reduce_axis((0, 16), name="k")
    linear = te.compute((8, 12), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="matmul")
    batched = te.compute((2, 8, 8), lambda b, i, j: te.sum(a[b, i, k] * a[b, j, k], axis=k), name="matmul")
    assert weight_read(te.create_prim_func([x, w, linear])) == (1, True)
    assert weight_read(te.create_prim_func([a, batched])) is None

    workload = parse_workload("matmul:m=48,n=40,k=24")
    assert weight_read(workload.prim_func()) == (1, False)
    template = FusedMatmulTemplate()
    arrays = workload.make_inputs()
    expected = workload.reference(arrays)
    for config in ({}, {"j_split": "1x8x5", "i_split": "4x3x4"}):
        config = template.validate(config, workload)
        nb = split_factors(config["j_split"])[-1]  # the register tile's width: the packed block
        assert config["layout_transform"] == "weights_prepacked"
        mod = template.schedule(workload, config)
        assert "meta_schedule.layout_rewrite_preproc" in mod.script()  # the packing copy a model runs at build time
        split, prepack = split_prepack(mod)
        assert prepack == Prepack(1, (40 // nb, 24, nb), "float32") and "layout_rewrite_preproc" not in split["main"].script()
        for built, packing in ((mod, None), (split, prepack)):
            _check_output(built, packing, arrays, expected, 1e-5)


def _check_output(mod, prepack, arrays, expected, tol: float) -> None:
    """``mod`` built for this CPU computes ``expected`` from ``arrays`` (``prepack``'s weight packed first)."""
    import tvm

    from opbench.measure.prepack import prepacked_args

    kernel = tvm.compile(mod, "llvm")
    args = [tvm.runtime.tensor(v) for v in (*arrays, np.zeros_like(expected))]
    args = prepacked_args(kernel, args, prepack, lambda shape, dtype: tvm.runtime.empty(shape, dtype))
    kernel["main"](*args)
    np.testing.assert_allclose(args[-1].numpy(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("spec,knobs", [
    ("conv2d:n=1,c=16,h=9,w=9,k=128,r=2,s=2,stride=1,pad=0", {"oc_block": 16, "weight_pack_at": "oc_block"}),
    ("conv2d:n=1,c=16,h=12,w=12,k=32,r=3,s=3,stride=1,pad=1", {"algorithm": "winograd"}),
    ("conv2d:n=1,c=32,h=8,w=8,k=32,r=1,s=1,stride=1,pad=0", {"algorithm": "gemm"}),
    ("depthwise_conv2d:n=1,c=32,h=14,w=14,r=3,s=3,stride=2,pad=1", {"algorithm": "direct"}),  # rows pack nothing
])
def test_a_catalogue_conv_with_its_weight_prepacked_packs_it_outside_and_computes_the_same(spec, knobs):
    """``layout_transform=weights_prepacked`` on a catalogue conv times what a model's runs: the weight's packing
    (the direct conv's, even where it would be packed per block; Winograd's transform; the GEMM's panels) is split
    off, and the operator on the packed weight computes the unpacked one's output; a per-block packing is then
    not one of the trial's parameters."""
    from opbench.measure.prepack import split_prepack

    workload = parse_workload(spec)
    template = get_template(workload)
    assert {k.name: k.choices for k in template.knobs(workload)}["layout_transform"] == ("in_op", "weights_prepacked")
    assert template.default_config(workload)["layout_transform"] == "in_op"
    config = template.validate({**knobs, "layout_transform": "weights_prepacked"}, workload)
    assert "weight_pack_at" not in template.parameters(config, workload)
    split, prepack = split_prepack(template.schedule(workload, config))
    assert prepack is not None and "layout_rewrite_preproc" not in split["main"].script()
    arrays = workload.make_inputs()
    _check_output(split, prepack, arrays, workload.reference(arrays), 1e-4)


def _facts(isa: tuple[str, ...], l1d_ways: int) -> HostFacts:
    return dataclasses.replace(HostFacts.unknown("other"), isa=isa, l1d_ways=l1d_ways)


def test_kernel_and_packing_defaults_follow_the_cpu_they_are_built_for():
    avx512, avx2 = CpuShape.of(_facts(("avx2", "fma", "avx512f"), 12)), CpuShape.of(_facts(("avx", "avx2"), 8))
    arm64, armv7 = CpuShape.of(_facts(("asimd",), 4)), target_shape("pynq-z2")
    assert [(s.fp32_lanes, s.accumulator_registers) for s in (avx512, avx2, arm64, armv7)] == [(16, 16), (8, 8), (4, 16), (4, 8)]
    with_l2 = CpuShape.of(dataclasses.replace(_facts(("avx", "avx2"), 8), l2_kb=2048.0))
    assert [s.l2_kb for s in (with_l2, arm64, target_shape("rpi4"))] == [2048, DEFAULT_L2_KB, 1024]  # (arm64's: unknown)
    matmul, conv = parse_workload("matmul-512"), parse_workload("resnet50-c2")
    defaults = {}
    for shape in (avx512, avx2, arm64):
        with shaped_for(shape):
            tiled, packed = get_template(matmul).default_config(matmul), get_template(conv, "conv2d_nchwc").default_config(conv)
        defaults[shape] = (tiled["j_split"].split("x")[-1], tiled["i_split"].split("x")[-1], packed["oc_block"],
                           packed["ic_block"], packed["ow_block"])
    # register tiles two vectors wide (the matmul's columns, the conv's 64 output channels) by the rows the rest of
    # the accumulators hold, or the conv's columns that the registers beside its two weight vectors and broadcast hold
    # (AVX-512 and NEON: 29, 14 of 56 columns; AVX2: 13, 4 of them: 56 has no divisor 5 or 6)
    assert defaults[avx512] == ("32", "8", 32, 16, 14)
    assert defaults[avx2] == ("16", "4", 16, 8, 4)
    assert defaults[arm64] == ("8", "8", 8, 4, 14)  # rows 2 KiB apart, 4 ways: 8 rows share no set
    odd = parse_workload("conv2d:n=1,c=24,h=56,w=56,k=24,r=1,s=1")  # 24 channels: no two AVX-512 vectors of them
    with shaped_for(avx512):
        assert [get_template(odd).default_config(odd)[k] for k in ("oc_block", "ow_block", "packed_output")] == [12, 14, 0]
    assert current_shape() == target_shape("llvm")  # the shapes set for a build end with it
    softmax = parse_workload("bert-base-softmax")  # its root stages' whole-tensor loops split to the vector too
    with shaped_for(arm64):
        assert get_template(softmax).default_config(softmax)["inner_split"] == 4
        script = get_template(softmax).schedule(softmax, get_template(softmax).default_config(softmax)).script()
    assert "T.vectorized(4)" in script and "T.vectorized(16)" not in script


def test_row_reductions_default_to_a_vector_of_partial_sums():
    layer_norm, odd = parse_workload("bert-base-layernorm"), parse_workload("layer_norm:m=4,n=37")
    avx512 = CpuShape.of(_facts(("avx2", "fma", "avx512f"), 12))
    with shaped_for(avx512):
        template = get_template(layer_norm)
        config = template.default_config(layer_norm)
        script = template.schedule(layer_norm, config).script()
        assert get_template(odd).default_config(odd)["reduce_vector"] == 1  # 37: no partials that divide it
    assert config["reduce_vector"] == 16
    assert "row_sum_rf = T.sblock_alloc_buffer((128, 16))" in script  # a row's 16 partial sums side by side
    update = script[script.index('T.sblock("row_sum_rf_update")') - 200:script.index('T.sblock("row_sum_rf_update")')]
    assert "T.vectorized(16)" in update  # updated a vector at a time
    assert template.validate({**config, "reduce_vector": 1}, layer_norm)["reduce_vector"] == 1  # one scalar: a point too


def test_the_matmul_default_register_tile_takes_fewer_rows_where_they_would_alias_in_l1():
    assert (alias_free_rows(12288, 16, 8), alias_free_rows(2048, 16, 8), alias_free_rows(3072, 64, 8)) == (8, 16, 32)
    assert alias_free_rows(12288, 16, 4) == 4  # fewer ways, fewer rows
    ffn2 = parse_workload("dense:m=128,n=768,k=3072")  # rows of X 12 KiB apart: all in one L1 set
    ffn1 = parse_workload("bert-base-ffn1")  # 3 KiB apart
    with shaped_for(CpuShape.of(_facts(("avx2", "fma", "avx512f"), 8))):  # 16-lane vectors, whatever this host's
        assert get_template(ffn2).default_config(ffn2)["i_split"] == "4x4x8"
        assert get_template(ffn1).default_config(ffn1)["i_split"] == "2x4x16"


def test_a_conv_whose_two_weight_vectors_leave_one_column_defaults_to_one_vector_of_more_columns(build_checker):
    """AVX2's 16 registers leave two weight vectors 6 columns: a 7- or 13-wide output (ResNet's and MobileNet-v2's
    7x7, SqueezeNet's 13x13) would take one column, 3 loads for 2 FMAs; one vector of 7 or 13 columns loads 8 for 7.
    Widths with a divisor from 2 to 6 keep two vectors, and AVX-512's 32 registers keep them at 7 columns; the
    one-vector default computes the convolution."""
    from opbench.space.column_tiles import loads_per_fma

    avx2, avx512 = CpuShape.of(_facts(("avx", "avx2"), 8)), CpuShape.of(_facts(("avx2", "fma", "avx512f"), 12))
    assert loads_per_fma(1, 7) < loads_per_fma(2, 1) and loads_per_fma(2, 2) < loads_per_fma(1, 14)

    def tile(shape: CpuShape, width: int) -> tuple[int, int]:
        conv = parse_workload(f"conv2d:n=1,c=32,h={width},w={width},k=64,r=1,s=1")
        with shaped_for(shape):
            config = get_template(conv, "conv2d_nchwc").default_config(conv)
        return config["oc_block"], config["ow_block"]

    assert [tile(avx2, w) for w in (7, 13, 14, 27)] == [(8, 7), (8, 13), (16, 2), (16, 3)]
    assert [tile(avx512, w) for w in (7, 13)] == [(32, 7), (32, 13)]
    conv = parse_workload("conv2d:n=1,c=16,h=14,w=14,k=32,r=3,s=3,stride=2,pad=1")
    with shaped_for(avx2):
        config = get_template(conv, "conv2d_nchwc").default_config(conv)
    assert (config["oc_block"], config["ow_block"]) == (8, 7)
    records = build_checker.measure_batch([TrialSpec(conv, config, Resources(2), "conv2d_nchwc")])
    assert not failures(records), failures(records)


def test_a_matmul_read_along_its_columns_defaults_to_a_register_tile_two_vectors_wide():
    matmul, dense = parse_workload("matmul:m=128,n=768,k=3072"), parse_workload("dense:m=128,n=768,k=3072")
    with shaped_for(CpuShape.of(_facts(("avx2", "fma", "avx512f"), 12))):
        wide, narrow = get_template(matmul).default_config(matmul), get_template(dense).default_config(dense)
    # 8 rows x 32 columns, 16 row tiles by 2 column tiles a parallel block, each tile summing all of k
    assert (wide["i_split"], wide["j_split"], wide["order"]) == ("1x16x8", "12x2x32", "SSRRS:outer")
    # dense reads its weight across rows: one vector of columns, the reduction in chunks outside the tiles
    assert (narrow["j_split"].split("x")[-1], narrow["order"]) == ("16", "SRSRS:outer")
    with shaped_for(CpuShape(512, 32, 4)):  # rows 12 KiB apart share an L1 set: 4 ways, 4 rows
        assert get_template(matmul).default_config(matmul)["i_split"] == "2x16x4"


@pytest.mark.parametrize(("j_split", "width"), [("2x6x32", 32), ("2x4x48", min(16, current_shape().fp32_lanes)),
                                               ("4x32x3", None)])
def test_a_register_tile_is_vectorised_only_in_power_of_two_widths(j_split, width):
    """A 48-wide tile runs as 3 x 16 lanes (a 48-lane vector ran 28x slower here), one of odd width not at all."""
    workload = parse_workload("matmul:m=384,n=384,k=768")
    template = get_template(workload)
    config = {"cache_write": "none", "i_split": "3x8x16", "j_split": j_split, "k_inner": 3, "order": "SSRRS:root",
              "parallel": 1, "unroll_explicit": 1, "unroll_max_step": 16, "vectorize": 1}
    script = template.schedule(workload, template.validate(config, workload)).script()
    assert set(re.findall(r"T\.vectorized\(\d+\)", script)) == ({f"T.vectorized({width})"} if width else set()), script
    assert template.nest(template.validate(config, workload), workload).vector == (width or 0)


@pytest.mark.parametrize(("block", "width"), [(32, 32), (48, 16), (24, 8), (12, 12)])
def test_a_packed_channel_block_is_vectorised_in_widths_tvm_builds_well(block, width):
    """A 48-channel block runs as 3 x 16 lanes, 24 as 3 x 8 (its 48- and 24-lane vectors ran 25x and 11x slower
    here), 12 as one 12-lane vector; no vector of the kernel is both past a register and not a power of two."""
    workload = parse_workload("conv2d:n=1,c=64,h=28,w=28,k=96,r=3,s=3,stride=1,pad=1")
    template = get_template(workload)
    with shaped_for(CpuShape(512, 32)):
        config = template.validate({**template.default_config(workload), "algorithm": "direct", "oc_block": block},
                                   workload)
        script = template.schedule(workload, config).script()
        assert template.nest(config, workload).vector == width
    widths = {int(w) for w in re.findall(r"T\.vectorized\((\d+)\)", script)}
    assert width in widths and all(w <= 16 or w & (w - 1) == 0 for w in widths), widths


@pytest.mark.parametrize("name", ["matmul:m=96,n=48,k=64", "batch_matmul:b=3,m=32,n=24,k=16", "dense:m=12,n=40,k=32",
                                  "conv2d:n=1,c=32,h=14,w=14,k=48,r=3,s=3,pad=1",
                                  "conv2d:n=1,c=32,h=14,w=14,k=96,r=1,s=1,stride=2,pad=0",
                                  "depthwise_conv2d:n=1,c=96,h=14,w=14,r=3,s=3,pad=1"])
def test_the_nest_a_config_describes_is_the_one_its_schedule_builds(name):
    """The anchor's vectorised extent and the extent of its parallel loop, read from the scheduled TIR, are the
    nest's ``vector`` and ``parallel``, for random configs of each template (a latency model learns from the nest)."""
    from tvm import s_tir, tirx

    from opbench.workloads.fused import anchor_block

    workload = parse_workload(name)
    template, rng = get_template(workload), random.Random(name)
    space = template.search_space(workload)
    for _ in range(8):
        config = template.validate({k: rng.choice(v["_value"]) for k, v in space.items()}, workload)
        nest = template.nest(config, workload)
        sch = s_tir.Schedule(template.schedule(workload, config))
        block = sch.get_sblock("batch_gemm_update") if config.get("algorithm") == "winograd" else anchor_block(sch)
        loops = [sch.get(loop) for loop in sch.get_loops(block)]
        kinds = {tirx.ForKind.VECTORIZED: 0, tirx.ForKind.PARALLEL: 1}
        built = [0, 1]
        for loop in loops:
            if loop.kind in kinds:
                built[kinds[loop.kind]] = int(loop.extent)
        assert (nest.vector, nest.parallel) == tuple(built), (config, nest)
