"""Transposed convolutions in their sub-pixel form: the rewrite gives PyTorch's output, and eager's operator is
known by the convolution (or matrix product) the rewrite makes of it."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels import assert_rewrite_matches


def _relax_conv_transpose(x_shape, weight, stride, padding, output_padding, groups=1):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pads = (padding[0], padding[1], padding[0], padding[1])
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d_transpose(x, relax.const(weight), stride, pads, output_padding,
                                                                       groups=groups)))
        bb.emit_func_output(out)
    return bb.get()


# (input n, c, h, w), (weight c, f, r, s), stride, padding, output_padding: DCGAN's strided layer and its latent one,
# kernels not a multiple of the stride, output padding, unequal strides, a padding that crops more than a phase;
# each with the convolutions it makes: one (its phases along the output channels) where a phase has too few output
# channels to fill a vector and its own output grid saves little; one a phase where that computes no more
CASES = [((1, 3, 5, 5), (3, 4, 4, 4), (2, 2), (1, 1), (0, 0), 1), ((2, 4, 1, 1), (4, 6, 4, 4), (1, 1), (0, 0), (0, 0), 0),
         ((1, 4, 5, 5), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1), 1), ((1, 3, 4, 3), (3, 2, 6, 5), (3, 2), (2, 1), (1, 0), 1),
         ((1, 2, 4, 4), (2, 3, 4, 4), (2, 2), (3, 3), (0, 0), 4),  # 4x4 outputs of a 4x4 grid either way: a tie
         ((2, 3, 5, 5), (3, 32, 4, 4), (2, 2), (1, 1), (0, 0), 4), ((1, 4, 5, 5), (4, 16, 3, 3), (2, 2), (1, 1), (1, 1), 4),
         ((1, 3, 4, 3), (3, 16, 6, 5), (3, 2), (2, 1), (1, 0), 6), ((1, 2, 4, 4), (2, 32, 4, 4), (2, 2), (3, 3), (0, 0), 4)]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, output_padding, convolutions", CASES)
def test_the_sub_pixel_form_gives_pytorchs_transposed_convolution(x_shape, w_shape, stride, padding, output_padding,
                                                                  convolutions):
    import torch

    from opbench.workloads.models.subpixel import transposed_convs_as_convs

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(x_shape, dtype=np.float32), rng.standard_normal(w_shape, dtype=np.float32)
    expected = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=padding,
                                                    output_padding=output_padding).numpy()
    mod = transposed_convs_as_convs(_relax_conv_transpose(x_shape, w, stride, padding, output_padding))
    made = "R.matmul" if x_shape[2:] == (1, 1) else "R.nn.conv2d"  # a 1 x 1 input: one tap per output pixel
    assert_rewrite_matches(mod, x, expected, gone="conv2d_transpose", made=made)
    assert mod.script().count("R.nn.conv2d(") == convolutions


def test_a_grouped_transposed_convolution_is_left_as_it_is():
    from opbench.workloads.models.subpixel import transposed_convs_as_convs

    mod = _relax_conv_transpose((1, 4, 5, 5), np.ones((4, 2, 4, 4), "float32"), (2, 2), (1, 1), (0, 0), groups=2)
    assert "conv2d_transpose" in transposed_convs_as_convs(mod).script()


def test_eagers_transposed_convolution_is_known_by_the_convolution_its_sub_pixel_form_makes():
    from opbench.studies.models.eager_ops import eager_signature

    # DCGAN's 4x4 -> 8x8 layer: four phases, each 512 -> 256 channels of 2x2 taps giving 4x4 of the 8x8 outputs
    args = [None, None, None, [2, 2], [1, 1], [0, 0], 1, [1, 1]]
    assert eager_signature("aten::conv_transpose2d", [[1, 512, 4, 4], [512, 256, 4, 4]], args) == ("conv", 1, 512, 256, 2, 2, 4, 4)
    latent = [None, None, None, [1, 1], [0, 0], [0, 0], 1, [1, 1]]
    assert eager_signature("aten::conv_transpose2d", [[1, 100, 1, 1], [100, 512, 4, 4]], latent) == ("gemm", 1, 8192, 100)
    grouped = [None, None, None, [2, 2], [1, 1], [0, 0], 2, [1, 1]]
    assert eager_signature("aten::conv_transpose2d", [[1, 4, 4, 4], [4, 3, 4, 4]], grouped) == ("conv_transpose", 1, 4, 3, 4, 4, 8, 8)
