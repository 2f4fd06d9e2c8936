"""3-D convolutions as 2-D ones over depth-unfolded input: the rewrite gives PyTorch's output, and eager's operator is
known by the 2-D convolution the rewrite makes of it."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels import assert_rewrite_matches


def _relax_conv3d(x_shape, weight, stride, padding, dilation=1, groups=1):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv3d(x, relax.const(weight), stride, padding, dilation, groups)))
        bb.emit_func_output(out)
    return bb.get()


# (input n, c, d, h, w), (weight k, c, t, r, s), stride, padding, dilation: ResNet3D's 3x3x3 layer and its strided one,
# its 1x1x1 strided shortcut, its stem (3x7x7, strided in space only), a dilated kernel over a batch of two
CASES = [((1, 4, 5, 6, 6), (8, 4, 3, 3, 3), 1, 1, 1), ((1, 4, 6, 7, 7), (8, 4, 3, 3, 3), 2, 1, 1),
         ((1, 4, 6, 7, 7), (8, 4, 1, 1, 1), 2, 0, 1), ((1, 3, 4, 12, 12), (4, 3, 3, 7, 7), (1, 2, 2), (1, 3, 3), 1),
         ((2, 3, 7, 6, 6), (5, 3, 3, 3, 3), 1, (2, 1, 1), (2, 1, 1))]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation", CASES)
def test_the_depth_unfolded_form_gives_pytorchs_3d_convolution(x_shape, w_shape, stride, padding, dilation):
    import torch

    from opbench.workloads.models.depth_unfold import conv3ds_as_conv2ds

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(x_shape, dtype=np.float32), rng.standard_normal(w_shape, dtype=np.float32)
    expected = torch.nn.functional.conv3d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=padding,
                                          dilation=dilation).numpy()
    mod = conv3ds_as_conv2ds(_relax_conv3d(x_shape, w, stride, padding, dilation))
    assert_rewrite_matches(mod, x, expected, gone="conv3d", made="R.nn.conv2d", tolerance=1e-4)


def test_a_grouped_3d_convolution_is_left_as_it_is():
    from opbench.workloads.models.depth_unfold import conv3ds_as_conv2ds

    mod = _relax_conv3d((1, 4, 4, 5, 5), np.ones((4, 2, 3, 3, 3), "float32"), 1, 1, groups=2)
    assert "conv3d" in conv3ds_as_conv2ds(mod).script()


def test_eagers_3d_convolution_is_known_by_the_2d_convolution_its_unfolded_form_makes():
    from opbench.studies.models.eager_ops import eager_signature

    # ResNet3D-18's second stage, strided: 8 -> 4 frames, each 64 channels x 3 taps in, 14x14 out
    args = [None, None, None, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1]
    assert eager_signature("aten::conv3d", [[1, 64, 8, 28, 28], [128, 64, 3, 3, 3]], args) == \
        ("conv", 4, 192, 128, 3, 3, 14, 14)
    dilated = [None, None, None, [1, 1, 1], [2, 1, 1], [2, 1, 1], 1]  # taps 2 frames apart: 8 -> 8 frames
    assert eager_signature("aten::conv3d", [[2, 4, 8, 5, 5], [4, 4, 3, 3, 3]], dilated) == ("conv", 16, 12, 4, 3, 3, 5, 5)
    grouped = [None, None, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], 2]
    assert eager_signature("aten::conv3d", [[1, 4, 4, 5, 5], [4, 2, 3, 3, 3]], grouped) == ("conv3d", 1, 4, 4, 3, 3, 3, 4, 5, 5)
