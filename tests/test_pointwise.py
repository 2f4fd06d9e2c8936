"""The 1x1 convolution as a GEMM on NCHW (opbench/space/pointwise.py): where it is offered, its default on
different CPUs, correct kernels at every kind of pixel tile, and the nest it describes."""
from __future__ import annotations

import dataclasses
import random
import re

import pytest

from opbench.hardware.cpu_shape import CpuShape, shaped_for
from opbench.hardware.resources import HostFacts, Resources
from opbench.measure.types import TrialSpec
from opbench.space import get_template, pointwise
from opbench.workloads import parse_workload
from tests.kernels import failures

AVX512 = CpuShape.of(dataclasses.replace(HostFacts.unknown("other"), isa=("avx2", "fma", "avx512f"), l1d_ways=12))
AVX2 = CpuShape.of(dataclasses.replace(HostFacts.unknown("other"), isa=("avx", "avx2"), l1d_ways=8))


def _default(name: str, shape: CpuShape = AVX512, template: str | None = None) -> dict:
    workload = parse_workload(name)
    with shaped_for(shape):
        return get_template(workload, template).default_config(workload)


def test_the_gemm_is_offered_to_1x1_stride_1_convs_whose_pixels_tile_into_vectors_and_is_their_default():
    expansion = _default("conv2d:n=1,c=64,h=56,w=56,k=256,r=1,s=1")  # ResNet-50's 1x1 64 -> 256
    # two rows of 56 pixels (7 vectors) by 2 output channels: 14 FMAs for 9 loads, in 16 accumulators
    assert {k: v for k, v in expansion.items() if k.startswith("gemm") or k == "algorithm"} == {
        "algorithm": "gemm", "gemm_pixels": 112, "gemm_rows": 2, "gemm_reduce": 64, "gemm_order": "pixels_outer"}
    # more input channels than a chunk: the chunks outside the output-channel tiles, the parallel loop over pixel
    # tiles and enough panels of output channels (7 tiles of 112 pixels x 4 panels)
    reduction = _default("conv2d:n=1,c=128,h=28,w=28,k=512,r=1,s=1")
    assert (reduction["gemm_reduce"], reduction["gemm_order"]) == (64, "chunks_outer")
    with shaped_for(AVX512):
        workload = parse_workload("conv2d:n=1,c=128,h=28,w=28,k=512,r=1,s=1")
        assert get_template(workload).nest(reduction, workload).parallel == 7 * 4
    assert pointwise.pixel_tiles(28, 28, 16) == (112,)  # four rows: no part of a row is whole vectors
    assert pointwise.pixel_tiles(112, 112, 16) == (16, 112, 224)  # a 7th of a row, a row, two rows
    for name, template in [("conv2d:n=1,c=64,h=14,w=14,k=256,r=1,s=1", None),  # 14x14: no whole vectors of rows
                           ("conv2d:n=1,c=64,h=56,w=56,k=256,r=1,s=1,stride=2", None),
                           ("conv2d:n=1,c=64,h=56,w=56,k=64,r=1,s=1,pad=1", None),  # the output is 58x58
                           ("resnet50-c2", None), ("depthwise_conv2d:n=1,c=64,h=56,w=56,r=1,s=1", None),
                           ("conv2d:n=1,c=64,h=56,w=56,k=256,r=1,s=1", "conv2d")]:  # the tiled NCHW template
        assert _default(name, template=template).get("algorithm") != "gemm", name


def test_the_gemm_default_follows_the_cpus_vectors_and_registers():
    avx2 = _default("conv2d:n=1,c=64,h=56,w=56,k=256,r=1,s=1", AVX2)
    # 8 lanes, 8 accumulators: one vector of pixels by 8 output channels (8 FMAs for 9 loads) beats 7 by 1
    assert (avx2["gemm_pixels"], avx2["gemm_rows"]) == (8, 8)
    assert pointwise.pixel_tiles(28, 28, 8) == (56, 112)  # 8 lanes: two rows of 28 are whole vectors already


def test_an_output_that_streams_to_memory_takes_the_output_channels_outside_in_a_taller_tile():
    """MobileNetV2's expansion at batch 16 (16 -> 96 channels at 112x112: a 77 MB output, 16 FMAs an output, an
    image's data 0.8 MB): output-channel tiles outside, 3 rows of 7 vectors (21 accumulators beside the 7 pixel
    vectors and a weight); at batch 1 (4.8 MB), with 64 input channels (the FMAs' time) or with an image's data
    beyond L2, the defaults as before."""
    big_llc = dataclasses.replace(AVX512, l2_kb=1024, l3_kb=32768)
    streams = _default("conv2d:n=16,c=16,h=112,w=112,k=96,r=1,s=1", big_llc)
    assert {k: streams[k] for k in ("gemm_pixels", "gemm_rows", "gemm_order")} == {
        "gemm_pixels": 112, "gemm_rows": 3, "gemm_order": "channels_outer"}
    for name in ("conv2d:n=1,c=16,h=112,w=112,k=96,r=1,s=1", "conv2d:n=16,c=64,h=56,w=56,k=256,r=1,s=1",
                 "conv2d:n=16,c=32,h=112,w=112,k=96,r=1,s=1"):  # the last: 1.6 MB of data an image
        assert _default(name, big_llc)["gemm_order"] != "channels_outer", name
    assert _default("conv2d:n=16,c=16,h=112,w=112,k=96,r=1,s=1", dataclasses.replace(big_llc, l3_kb=262144))[
        "gemm_order"] == "pixels_outer"  # the output fits half of a 256 MB cache
    assert CpuShape.of(dataclasses.replace(HostFacts.unknown("other"), l3_kb=4096.0)).l3_kb == 4096.0  # the host's


# Odd shapes, each with a pixel tile of another kind: half a row of 32 pixels on a batch of 2 (input channels 5,
# output channels 12: no vector divides them), six rows of 8 pixels; the register tile's channels and the reduction
# chunk drawn at random, the reduction chunks outside, then the output-channel tiles outside. (A model's fused 1x1
# conv, its epilogue inlined and its weight packed once, is built with the GEMM and checked against PyTorch in
# tests/test_models.py.)
GEMM_ODD = {"conv2d:n=2,c=5,h=4,w=32,k=12,r=1,s=1": 16, "conv2d:n=1,c=24,h=6,w=8,k=12,r=1,s=1": 48,
            "conv2d:n=3,c=7,h=8,w=16,k=9,r=1,s=1": 32}  # a taller tile (3 rows), the channels outside


@pytest.mark.slow
def test_the_gemm_builds_correct_kernels_on_odd_shapes(build_checker):
    specs = []
    for index, (name, pixels) in enumerate(GEMM_ODD.items()):
        workload = parse_workload(name)
        template, rng = get_template(workload), random.Random(index)
        drawn = {k.name: rng.choice(k.choices) for k in template.knobs(workload) if k.name in ("gemm_rows", "gemm_reduce")}
        config = {"algorithm": "gemm", "gemm_pixels": pixels, "gemm_order": ("chunks_outer", "channels_outer")[index % 2],
                  **drawn, **({"gemm_rows": 3} if index == 2 else {})}
        specs.append(TrialSpec(workload, config, Resources(1 + index % 2), template.name))
    records = build_checker.measure_batch(specs)
    wrong = failures(records, "knob.gemm")
    assert not wrong, wrong[:3]
    assert [r["knob.gemm_pixels"] for r in records] == list(GEMM_ODD.values())


def test_the_gemm_writes_each_tile_in_whole_vectors_and_its_nest_is_the_built_one():
    """The anchor's vectorised and parallel extents are the nest's; the tile's write-back (the epilogue inlined)
    is vectorised in the CPU's lanes, and no loop of the kernel is vectorised wider."""
    from tvm import s_tir, tirx

    from opbench.workloads.fused import anchor_block

    workload = parse_workload("conv2d:n=1,c=32,h=8,w=48,k=48,r=1,s=1")
    template = get_template(workload)
    with shaped_for(AVX512):
        for pixels, order in zip((16, 48, 96, 192), ("pixels_outer", "chunks_outer", "channels_outer", "pixels_outer")):
            config = template.validate({"algorithm": "gemm", "gemm_pixels": pixels, "gemm_rows": 3, "gemm_order": order,
                                        "gemm_reduce": 8}, workload)
            nest, module = template.nest(config, workload), template.schedule(workload, config)
            sch = s_tir.Schedule(module)
            loops = [sch.get(loop) for loop in sch.get_loops(anchor_block(sch))]
            built = {loop.kind: int(loop.extent) for loop in loops if loop.kind != tirx.ForKind.SERIAL}
            assert (nest.vector, nest.parallel) == (built[tirx.ForKind.VECTORIZED], built[tirx.ForKind.PARALLEL])
            pixel_tiles = 8 * 48 // pixels
            panels = next(p for p in (1, 2, 4, 8, 16) if p * pixel_tiles >= 16) if order == "chunks_outer" else 48 // 3
            assert nest.tile == (3, pixels) and nest.parallel == pixel_tiles * panels
            assert set(re.findall(r"T\.vectorized\((\d+)\)", module.script())) <= {"16", "3"}, pixels


def test_a_gemm_tile_accumulates_in_a_buffer_of_its_own_size_that_tvm_puts_on_the_stack():
    """A tile that is part of a row, and one of whole rows: inside the parallel loop of tiles, one buffer of the
    tile's rows x pixels, ``global`` (TVM 0.27 puts one under 1 KB on the stack, which LLVM keeps in registers; a
    ``local`` one is taken from the workspace pool for every tile, and a tile split from the fused rows and columns
    was bounded by millions of pixels)."""
    from opbench.hardware.targets import make_target
    from opbench.measure.memory import lowered

    workload = parse_workload("conv2d:n=1,c=16,h=4,w=48,k=8,r=1,s=1")
    template = get_template(workload)
    with shaped_for(AVX2):
        for pixels in (16, 96):  # a third of a row; two rows
            config = template.validate({"algorithm": "gemm", "gemm_pixels": pixels, "gemm_rows": 2,
                                        "gemm_reduce": 16, "gemm_order": "pixels_outer"}, workload)
            script = lowered(template.schedule(workload, config), make_target("llvm", 1)).script()
            tiles = script.split("T.parallel(")[-1]  # the loop of tiles (after the weight's packing)
            assert re.findall(r'T\.alloc_(\w+)\(\((\d+),\), "float32x(\d+)"\)', tiles) == [
                ("buffer", str(2 * pixels // 8), "8")], pixels
