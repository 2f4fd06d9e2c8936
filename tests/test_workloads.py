import numpy as np
import pytest

from opbench.exceptions import WorkloadError
from opbench.hardware.resources import Resources
from opbench.workloads import OPERATORS, PRESETS, parse_workload


def test_every_preset_parses_and_round_trips_through_its_spec():
    for name in PRESETS:
        w = parse_workload(name)
        assert w.name == name
        again = parse_workload(w.spec)
        assert again.params == w.params and again.op is w.op and again.preset is None


def test_required_presets_exist_with_their_real_shapes():
    assert parse_workload("bert-base-ffn1").params == {"m": 128, "n": 3072, "k": 768, "bias": 1}
    attn = parse_workload("bert-base-attn")
    assert attn.op.input_shapes(attn.params) == [(12, 128, 64), (12, 64, 128)]
    c2 = parse_workload("resnet50-c2")
    assert c2.op.output_shape(c2.params) == (1, 64, 56, 56)
    assert {"matmul-512", "matmul-1024", "resnet50-c5", "mobilenetv2-dw"} <= set(PRESETS)


def test_flops_and_bytes():
    w = parse_workload("matmul:m=2,n=3,k=4")
    assert w.flops == 2 * 2 * 3 * 4
    assert w.bytes == (2 * 4 + 4 * 3 + 2 * 3) * 4
    conv = parse_workload("conv2d:n=1,c=3,h=8,w=8,k=4,r=3,s=3,stride=2,pad=1")
    assert conv.op.output_shape(conv.params) == (1, 4, 4, 4)
    assert conv.flops == 2 * 4 * 4 * 4 * 3 * 3 * 3


def test_catalogue_covers_the_required_op_kinds():
    assert {"matmul", "batch_matmul", "dense", "conv2d", "depthwise_conv2d", "pool2d", "softmax", "layer_norm",
            "add_relu", "conv3d", "conv2d_transpose"} <= set(OPERATORS)


@pytest.mark.parametrize(("spec", "output", "flops"), [
    ("conv3d:n=2,c=3,d=4,h=6,w=6,k=5,t=3,r=3,s=3,stride=2,pad=1", (2, 5, 2, 3, 3), 2 * (2 * 5 * 2 * 3 * 3) * 3 * 27),
    # DCGAN's layer: 4x4 -> 8x8; each input pixel meets every weight once (the spread input's zeros are not counted)
    ("conv2d_transpose:n=1,c=8,h=4,w=4,k=4,r=4,s=4,stride=2,pad=1", (1, 4, 8, 8), 2 * (8 * 4 * 4) * 4 * 16),
    ("conv2d_transpose:n=1,c=2,h=3,w=3,k=2,r=3,s=3,stride=2,output_padding=1", (1, 2, 8, 8), 2 * (2 * 3 * 3) * 2 * 9)])
def test_3d_and_transposed_convolutions_have_pytorchs_shapes(spec, output, flops):
    workload = parse_workload(spec)
    assert workload.op.output_shape(workload.params) == output == workload.reference(workload.make_inputs()).shape
    assert workload.flops == flops


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nosuchop:m=1", "unknown operator 'nosuchop'"),
        ("resnet51-c2", "unknown workload 'resnet51-c2'"),
        ("matmul:m=4,n=4", "missing key(s) k"),
        ("matmul:m=4,n=4,k=0", "key 'k' must be a positive integer"),
        ("matmul:m=4,n=x,k=4", "key 'n' must be a positive integer"),
        ("matmul:m=4,n=4,k=4,q=1", "unknown key(s) q"),
        ("matmul:m=4,n=4,k", "malformed item 'k'"),
        ("matmul:m=4,n=4,k=4,dtype=int3", "unsupported dtype 'int3'; matmul takes float32, float16, int8, bfloat16"),
        ("softmax:m=4,n=8,dtype=int8", "unsupported dtype 'int8'; softmax takes float32, float16"),
        ("conv3d:n=1,c=3,d=4,h=8,w=8,k=4,t=3,r=3,s=3,dtype=int8", "conv3d takes float32, float16"),
        ("conv2d:n=1,c=3,h=2,w=2,k=4,r=5,s=5", "kernel larger than padded input"),
        ("pool2d:n=1,c=3,h=8,w=8,r=2,s=2,kind=median", "key 'kind' must be 'max' or 'avg'"),
        ("conv3d:n=1,c=3,d=2,h=8,w=8,k=4,t=3,r=3,s=3", "kernel larger than padded input"),
        ("conv2d_transpose:n=1,c=3,h=4,w=4,k=4,r=3,s=3,pad=3", "pad 3 must be below the kernel (3x3)"),
        ("conv2d_transpose:n=1,c=3,h=4,w=4,k=4,r=3,s=3,stride=2,output_padding=2", "output_padding 2 must be below stride 2"),
        ("conv2d_transpose:n=1,c=3,h=4,w=4,k=4,r=3,s=3,pad=-1", "key 'pad' must be a non-negative integer"),
    ],
)
def test_bad_workloads_name_the_problem(text, message):
    with pytest.raises(WorkloadError, match=None) as info:
        parse_workload(text)
    assert message in str(info.value)


def test_an_int8_workload_is_u8_times_i8_into_i32_and_counts_its_bytes_by_type():
    from opbench.studies.references import library_references

    workload = parse_workload("dense:m=4,n=16,k=8,bias=1,dtype=int8")
    assert workload.op.input_dtypes(workload.params, "int8") == ["uint8", "int8", "int32"]
    assert workload.output_dtype == "int32" and workload.spec.endswith(",dtype=int8")
    assert workload.bytes == 4 * 8 * 1 + 8 * 16 * 1 + 16 * 4 + 4 * 16 * 4
    assert parse_workload(workload.spec).task_key != parse_workload("dense:m=4,n=16,k=8,bias=1").task_key
    assert library_references(workload, Resources(1)) == ["onnxruntime"]  # neither PyTorch nor numpy computes u8 x i8 into i32
    assert "A: T.Buffer((16, 24), \"uint8\")" in parse_workload("matmul:m=16,n=24,k=24,dtype=int8").prim_func().script()


def test_a_bf16_workload_is_bf16_operands_into_fp32():
    workload = parse_workload("dense:m=4,n=16,k=8,bias=1,dtype=bfloat16")
    assert workload.op.input_dtypes(workload.params, "bfloat16") == ["bfloat16"] * 3 and workload.output_dtype == "float32"
    assert workload.bytes == (4 * 8 + 8 * 16 + 16) * 2 + 4 * 16 * 4
    assert workload.tolerance() == (1e-3, 1e-3)


def test_float_inputs_are_away_from_zero_with_either_sign():
    """A model operator divides by some inputs (a batch norm's scale): drawn near zero, such a divisor amplified
    two correct float32 results' rounding apart (yolov3-tiny's 384-channel convolution failed its check)."""
    for name in ("conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,pad=1", "conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,pad=1,dtype=bfloat16"):
        for array in parse_workload(name).make_inputs():
            values = array.astype("float32")
            assert np.abs(values).min() >= 0.5 and np.abs(values).max() <= 1.0  # bf16 rounds up to 1
            assert (values < 0).mean() == pytest.approx(0.5, abs=0.1)
