"""A depthwise convolution (stride 1 or 2) by rows on NCHW (opbench/space/depthwise_rows.py): where it is offered and
is the default, correct kernels on odd shapes and on a model's fused operator, and the nest it describes."""
from __future__ import annotations

import dataclasses

import pytest

from opbench.hardware.cpu_shape import CpuShape, shaped_for
from opbench.hardware.resources import HostFacts, Resources
from opbench.measure.types import TrialSpec
from opbench.space import get_template
from opbench.workloads import parse_workload
from tests.kernels import failures, random_points

AVX512 = CpuShape.of(dataclasses.replace(HostFacts.unknown("other"), isa=("avx2", "fma", "avx512f"), l1d_ways=12))
AVX2 = CpuShape.of(dataclasses.replace(HostFacts.unknown("other"), isa=("avx", "avx2"), l1d_ways=8))


def _default(name: str, shape: CpuShape = AVX512) -> dict:
    workload = parse_workload(name)
    with shaped_for(shape):
        return get_template(workload).default_config(workload)


def _algorithms(name: str) -> tuple:
    workload = parse_workload(name)
    return next((k.choices for k in get_template(workload).knobs(workload) if k.name == "algorithm"), ())


def test_rows_are_offered_to_same_padded_depthwise_convs_and_are_the_default_for_small_windows_on_wide_rows():
    # MobileNetV2's 144 channels at 56x56: rows of 7 vectors of 8 (56's largest power-of-two factor), one row a tile
    # in a quarter of AVX-512's 32 registers; 16 columns, one vector: 8 rows (on AVX2 two registers a row: 2 rows)
    assert {k: _default("mobilenetv2-dw")[k] for k in ("algorithm", "rows_tile")} == {"algorithm": "rows", "rows_tile": 1}
    narrow = "depthwise_conv2d:n=1,c=32,h=16,w=16,r=3,s=3,stride=1,pad=1"
    assert (_default(narrow)["rows_tile"], _default(narrow, AVX2)["rows_tile"]) == (8, 2)
    assert _algorithms("mobilenetv2-dw") == ("direct", "rows")
    for stride_2 in ("depthwise_conv2d:n=1,c=96,h=112,w=112,r=3,s=3,stride=2,pad=1",  # MobileNetV2's: by column phases
                     "depthwise_conv2d:n=1,c=576,h=14,w=14,r=3,s=3,stride=2,pad=1"):  # rows of 7 at stride 2 too
        assert _algorithms(stride_2) == ("direct", "rows") and _default(stride_2)["algorithm"] == "rows", stride_2
    assert _algorithms("depthwise_conv2d:n=1,c=96,h=56,w=56,r=3,s=3,stride=1,pad=0") == ()  # a 54x54 output
    assert _algorithms("depthwise_conv2d:n=1,c=96,h=56,w=56,r=3,s=3,stride=2,pad=0") == ()  # 27x27: not "same"
    assert _algorithms("depthwise_conv2d:n=1,c=96,h=56,w=56,r=1,s=1,stride=2,pad=0") == ()  # no padding stage
    for name in ("depthwise_conv2d:n=1,c=96,h=56,w=56,r=7,s=7,stride=1,pad=3",  # ConvNeXt's 7x7 window
                 "depthwise_conv2d:n=1,c=960,h=7,w=7,r=3,s=3,stride=1,pad=1"):  # rows of 7
        assert _algorithms(name) == ("direct", "rows") and _default(name)["algorithm"] == "direct", name


def test_a_row_whose_power_of_two_vectors_would_be_under_half_a_register_is_one_vector_if_it_fits_two():
    """MobileNetV2's 384 channels at 14x14 on AVX2: one vector of 14 lanes (two registers) a row, two rows a tile
    (not seven vectors of 2 lanes, one row); on AVX-512 one register, and 28 columns one vector of two registers
    (not seven of 4 lanes); 12 and 56 columns keep half-register and whole-register vectors, and a row wider than
    two registers keeps its vectors."""
    def nest(width: int, shape: CpuShape) -> tuple[int, int]:
        workload = parse_workload(f"depthwise_conv2d:n=1,c=384,h={width},w={width},r=3,s=3,stride=1,pad=1")
        with shaped_for(shape):
            template = get_template(workload)
            config = template.validate({"algorithm": "rows"}, workload)
            return template.nest(config, workload).vector, config["rows_tile"]

    assert nest(14, AVX2) == (14, 2) and nest(14, AVX512) == (14, 7)
    assert nest(28, AVX512) == (28, 4)  # two registers a row: four rows in AVX-512's eight accumulators
    assert nest(12, AVX2)[0] == 4 and nest(56, AVX2)[0] == 8 and nest(18, AVX2)[0] == 2


# Odd shapes: a batch of 2, 5 channels and a prime width (AVX2: no vector, one lane a column; AVX-512: one vector of
# 17); 14 columns (one vector of 14); a 5x5 window on rows of 24 (vectors of 8); at stride 2, an odd padded width (29: the last phase a column short)
# and a 5x5 window over rows of 34 into 17; each with a row tile drawn at random.
ROWS_ODD = ("depthwise_conv2d:n=2,c=5,h=9,w=17,r=3,s=3,stride=1,pad=1", "depthwise_conv2d:n=1,c=8,h=14,w=14,r=3,s=3,stride=1,pad=1",
            "depthwise_conv2d:n=1,c=4,h=12,w=24,r=5,s=5,stride=1,pad=2",
            "depthwise_conv2d:n=2,c=5,h=27,w=27,r=3,s=3,stride=2,pad=1",
            "depthwise_conv2d:n=1,c=8,h=20,w=34,r=5,s=5,stride=2,pad=2")


@pytest.mark.slow
def test_rows_build_correct_kernels_on_odd_shapes(build_checker):
    records = build_checker.measure_batch(random_points("rows", ("rows_tile",), ROWS_ODD))
    assert not failures(records, "knob.rows_tile"), failures(records, "knob.rows_tile")[:3]
    assert {r["knob.algorithm"] for r in records} == {"rows"}


@pytest.mark.slow
def test_a_models_fused_depthwise_conv_by_rows_matches_its_unscheduled_build(build_checker):
    """MobileNetV2's depthwise convs (tiny: 16 channels at 16x16; 96 at 4x4; stride 2 with TensorFlow's padding, one
    column on the right) with their bias and ReLU6 folded into the tiles' write-back, their weight read as it lies
    (nothing packed at build time)."""
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.cache import extract

    model = "mobilenet-v2@tiny"
    workloads = [parse_workload(model_name(model, op.name, 1, 128)) for op in extract(model, 1, 128)[0]]
    rows = [w for w in workloads if "rows" in _algorithms(w.name)]
    assert len(rows) >= 2 and any(get_template(w).default_config(w)["algorithm"] == "rows" for w in rows)
    assert any(w.axes[2].extent < w.op.input_shapes(w.params)[0][2] for w in rows)  # a stride-2 one among them
    specs = [TrialSpec(w, get_template(w).validate({"algorithm": "rows"}, w), Resources(2), get_template(w).name)
             for w in rows]
    records = build_checker.measure_batch(specs)
    assert not failures(records, "knob.algorithm"), failures(records, "knob.algorithm")[:3]


def test_rows_nest_is_the_built_one():
    """The anchor's vectorised and parallel extents are the nest's, and the padded plane is built per channel,
    zeros and then the interior, inside the parallel loop."""
    from tvm import s_tir, tirx

    from opbench.workloads.fused import anchor_block

    workload = parse_workload("depthwise_conv2d:n=2,c=6,h=12,w=24,r=3,s=3,stride=1,pad=1")
    template = get_template(workload)
    with shaped_for(AVX512):
        for rows in (1, 3, 4):
            config = template.validate({"algorithm": "rows", "rows_tile": rows}, workload)
            nest, module = template.nest(config, workload), template.schedule(workload, config)
            sch = s_tir.Schedule(module)
            loops = [sch.get(loop) for loop in sch.get_loops(anchor_block(sch))]
            built = {loop.kind: int(loop.extent) for loop in loops if loop.kind != tirx.ForKind.SERIAL}
            assert (nest.vector, nest.parallel) == (built[tirx.ForKind.VECTORIZED], built[tirx.ForKind.PARALLEL]) == (8, 12)
            assert nest.tile == (rows, 24) and nest.reduce == 9
            padding = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.startswith("pad")]
            assert len(padding) == 2  # zeros, then the interior
            assert all(sch.get(sch.get_loops(b)[0]).kind == tirx.ForKind.PARALLEL for b in padding), module.script()


def test_a_stride_2_plane_is_split_into_column_phases_that_every_tap_reads_contiguously():
    """At stride 2 the per-channel plane has two column phases (an odd padded width: the second a column short of
    the first, padded), and the anchor reads it along the vectorised loop with unit stride; every block that writes
    the plane (the short phase's padding too) runs inside the parallel loop over channels, so that the plane is one
    channel's buffer, not every channel's planes in memory."""
    from tvm import s_tir, tirx

    from opbench.workloads.fused import anchor_block

    for name, phases in (("depthwise_conv2d:n=1,c=8,h=28,w=28,r=3,s=3,stride=2,pad=1", (2, 30, 15)),
                         ("depthwise_conv2d:n=1,c=8,h=27,w=27,r=3,s=3,stride=2,pad=1", (2, 29, 15))):
        workload = parse_workload(name)
        template = get_template(workload)
        with shaped_for(AVX512):
            module = template.schedule(workload, template.validate({"algorithm": "rows", "rows_tile": 1}, workload))
        sch = s_tir.Schedule(module)
        conv = sch.get(anchor_block(sch))
        plane = conv.reads[1].source if conv.reads[0].source.name == conv.writes[0].source.name else conv.reads[0].source
        assert tuple(int(d) for d in plane.shape[-3:]) == phases, module.script()
        x = conv.iter_vars[3].var  # the output column: the vectorised loop's
        phase, _, column = next(r for r in conv.reads if r.source.same_as(plane)).region[-3:]
        assert x.name in str(column.min) and "* 2" not in str(column.min), column.min  # consecutive lanes, columns
        assert x.name not in str(phase.min), phase.min  # one phase a tap
        writers = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
                   if any(w.source.same_as(plane) for w in sch.get(b).writes)]
        assert writers and all(sch.get(sch.get_loops(b)[0]).kind == tirx.ForKind.PARALLEL for b in writers), module.script()
