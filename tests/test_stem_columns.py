"""A convolution of few input channels by columns on NCHW (opbench/space/stem_columns.py): where it is offered and is
the default, correct kernels on odd shapes and on a model's fused operators, and the nest it describes."""
from __future__ import annotations

import pytest

from opbench.hardware.cpu_shape import shaped_for
from opbench.hardware.resources import Resources
from opbench.measure.types import TrialSpec
from opbench.space import get_template
from opbench.workloads import parse_workload
from tests.kernels import failures, random_points
from tests.test_depthwise_rows import AVX2, AVX512

KNOBS = ("columns_channels", "columns_rows", "columns_vectors")


def _space(name: str, shape=AVX512) -> tuple[tuple, dict]:
    """The workload's algorithms and its default config on ``shape``."""
    workload = parse_workload(name)
    with shaped_for(shape):
        template = get_template(workload)
        algorithms = next((k.choices for k in template.knobs(workload) if k.name == "algorithm"), ())
        return algorithms, template.default_config(workload)


def test_columns_are_offered_to_convs_of_few_input_channels_on_whole_vectors_of_the_width():
    # ResNet-50's stem: 112 columns, 7 vectors of 16; every one of YOLOv3-tiny's 16 output channels in one tile
    assert _space("resnet50-stem")[0] == ("direct", "columns")
    assert {k: _space("resnet50-stem")[1][k] for k in ("algorithm", *KNOBS)} == {
        "algorithm": "columns", "columns_channels": 8, "columns_rows": 1, "columns_vectors": 1}
    assert _space("conv2d:n=1,c=3,h=416,w=416,k=16,r=3,s=3,stride=1,pad=1")[1]["columns_channels"] == 16
    assert _space("resnet50-stem", AVX2)[1]["algorithm"] == "columns"  # vectors of 8
    # offered where a row is whole vectors of half the lanes, the default on whole registers only: ResNet3D-18's
    # depth-unfolded stem (9 channels, rows of 56: vectors of 8) on AVX-512; on AVX2 9 channels are not few
    stem3d = "conv2d:n=4,c=9,h=112,w=112,k=64,r=7,s=7,stride=2,pad=3"
    algorithms, default = _space(stem3d)
    assert algorithms == ("direct", "columns") and default["algorithm"] == "direct"
    assert _space(stem3d, AVX2)[0] == ()
    assert _space("conv2d:n=1,c=3,h=224,w=224,k=64,r=3,s=3,stride=2,pad=0")[0] == ()  # 111 columns: direct only
    assert _space("resnet50-c2")[0] == ("direct", "winograd")  # 64 input channels
    assert _space("conv2d:n=1,c=3,h=256,w=256,k=8,r=16,s=16,stride=16,pad=0")[1]["algorithm"] == "direct"  # 256 taps


# Odd shapes: a batch of 2 at stride 2 whose padded width is odd (its phases padded), stride 3, a 5x5 window on
# 24 columns (vectors of 8), a 1x3 window; each at a point of the columns' knobs drawn at random.
COLUMNS_ODD = ("conv2d:n=2,c=3,h=31,w=31,k=6,r=3,s=3,stride=2,pad=1", "conv2d:n=1,c=2,h=49,w=49,k=4,r=4,s=4,stride=3,pad=1",
               "conv2d:n=1,c=5,h=24,w=24,k=12,r=5,s=5,stride=1,pad=2", "conv2d:n=1,c=1,h=4,w=16,k=3,r=1,s=3,stride=1,pad=1")


@pytest.mark.slow
def test_columns_build_correct_kernels_on_odd_shapes(build_checker):
    records = build_checker.measure_batch(random_points("columns", KNOBS, COLUMNS_ODD))
    assert not failures(records, "knob.columns"), failures(records, "knob.columns")[:3]
    assert {r["knob.algorithm"] for r in records} == {"columns"}


@pytest.mark.slow
def test_a_models_fused_stems_by_columns_match_their_unscheduled_build(build_checker):
    """VGG-16's and YOLOv3-tiny's convolutions of few channels (tiny: 3 to 8), their bias and ReLU (leaky) folded
    into the tiles' write-back; the columns offered on this host's CPU, whose kernels are built."""
    from opbench.hardware.cpu_shape import current_shape
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.cache import extract

    specs = []
    for model in ("vgg-16@tiny", "yolov3-tiny@tiny"):
        for op in extract(model, 1, 128)[0]:
            workload = parse_workload(model_name(model, op.name, 1, 128))
            template = get_template(workload)
            if "columns" in _space(workload.name, current_shape())[0]:
                config = template.validate({"algorithm": "columns"}, workload)
                specs.append(TrialSpec(workload, config, Resources(2), template.name))
    assert len(specs) >= 4
    records = build_checker.measure_batch(specs)
    assert not failures(records, "knob.algorithm"), failures(records, "knob.algorithm")[:3]


def test_columns_nest_is_the_built_one():
    """The anchor's vectorised and parallel extents are the nest's; the data is copied once into its phases."""
    from tvm import s_tir, tirx

    from opbench.workloads.fused import anchor_block

    workload = parse_workload("conv2d:n=2,c=3,h=48,w=64,k=12,r=3,s=3,stride=2,pad=1")
    template = get_template(workload)
    with shaped_for(AVX512):
        for channels, rows, vectors in ((4, 1, 2), (12, 2, 1), (1, 4, 1)):
            config = template.validate({"algorithm": "columns", "columns_channels": channels, "columns_rows": rows,
                                        "columns_vectors": vectors}, workload)
            nest, module = template.nest(config, workload), template.schedule(workload, config)
            sch = s_tir.Schedule(module)
            loops = [sch.get(loop) for loop in sch.get_loops(anchor_block(sch))]
            built = {loop.kind: int(loop.extent) for loop in loops if loop.kind != tirx.ForKind.SERIAL}
            assert (nest.vector, nest.parallel) == (built[tirx.ForKind.VECTORIZED], built[tirx.ForKind.PARALLEL])
            assert nest.tile == (channels, rows, vectors * 16) and nest.reduce == 27
            assert nest.parallel == 2 * 12 // channels * 24 // rows
            buffers = {str(b.name): [int(d) for d in b.shape] for b in module["main"].body.block.alloc_buffers}
            assert [2, 3, 2, 50, 33] in buffers.values(), buffers  # 66 padded columns in 2 phases of 33
