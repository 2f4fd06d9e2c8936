"""A model's 3-D convolutions rewritten as 2-D ones over depth-unfolded input before it is fused
(docs/workloads-and-templates.md#3-d-convolutions).

An output frame ``z`` of a 3-D convolution sums, over the kernel's ``T`` depth taps ``t``, a 2-D convolution of input
frame ``z * stride + t * dilation`` with the kernel's slice ``t``. Stacking those ``T`` frames along the channels
makes it one 2-D convolution with ``C * T`` input channels; the output frames become its batch::

    x (N, C, D, H, W) -> pad depth -> T strided frames -> (N * Do, C * T, H, W)
    w (K, C, T, R, S) -> (K, C * T, R, S)
    conv2d (N * Do, K, Ho, Wo) -> (N, K, Do, Ho, Wo)

The input is copied ``T`` times, and the convolution takes the catalogue convolution's packed templates and what is
tuned for them. The weight is a constant: its reshape is folded at build time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opbench.workloads._base import conv_out
from opbench.workloads.models.graph import rewrite_calls


@dataclass(frozen=True)
class DepthUnfold:
    """The sizes of one 3-D convolution's unfolded form."""

    frames: int  # output frames (Do)
    taps: int  # the kernel's depth (T)
    stride: int
    dilation: int
    pad: tuple[int, int]  # front, back

    @classmethod
    def of(cls, depth: int, taps: int, stride: int, dilation: int, pad: tuple[int, int]) -> DepthUnfold:
        return cls(conv_out(depth + sum(pad), taps, stride, 0, dilation), taps, stride, dilation, pad)

    def conv_signature(self, n: int, c: int, k: int, kernel: tuple[int, int], out: tuple[int, int]) -> tuple[int, ...]:
        """(batch, input channels, output channels, kernel h, kernel w, out h, out w) of the 2-D convolution."""
        return (n * self.frames, c * self.taps, k, *kernel, *out)


def conv3ds_as_conv2ds(mod: Any) -> Any:
    """Every NCDHW ``conv3d`` (one group, static sizes) as a ``conv2d`` over its depth-unfolded input; any other left
    as it is."""
    from tvm.relax.dpl import is_op, wildcard

    data, weight = wildcard(), wildcard()
    conv = is_op("relax.nn.conv3d")(data, weight)

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        x, w, attrs = matches[data], matches[weight], matches[conv].attrs
        layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
        if layouts != ("NCDHW", "OIDHW", "NCDHW") or int(attrs.groups) != 1:
            return expr
        try:
            depth = int(list(x.ty.shape)[2])
            taps = int(list(w.ty.shape)[2])
        except TypeError:  # a symbolic size
            return expr
        strides, dilation, padding = ([int(v) for v in a] for a in (attrs.strides, attrs.dilation, attrs.padding))
        unfold = DepthUnfold.of(depth, taps, strides[0], dilation[0], (padding[0], padding[3]))
        return _as_conv2d(x, w, unfold, strides[1:], dilation[1:], (*padding[1:3], *padding[4:]), attrs.out_dtype)

    return rewrite_calls(mod, conv, rewrite)


def _as_conv2d(x: Any, w: Any, unfold: DepthUnfold, strides: list[int], dilation: list[int],
               padding: tuple[int, ...], out_dtype: Any) -> Any:
    """(N, C, D, H, W) -> its ``taps`` strided frame sequences stacked as channels -> one ``conv2d`` -> NCDHW."""
    from tvm.relax import op

    n, c, _, h, wd = (int(v) for v in x.ty.shape)
    k, _, taps, r, s = (int(v) for v in w.ty.shape)
    if any(unfold.pad):
        x = op.nn.pad(x, [0, 0, 0, 0, *unfold.pad, 0, 0, 0, 0])
    span = (unfold.frames - 1) * unfold.stride + 1
    frames = [op.strided_slice(x, [2], [t * unfold.dilation], [t * unfold.dilation + span], [unfold.stride])
              for t in range(taps)]  # each (N, C, Do, H, W)
    stacked = op.permute_dims(op.stack(frames, axis=2), [0, 3, 1, 2, 4, 5])  # (N, Do, C, T, H, W)
    unfolded = op.reshape(stacked, (n * unfold.frames, c * taps, h, wd))
    out = op.nn.conv2d(unfolded, op.reshape(w, (k, c * taps, r, s)), strides, padding, dilation, 1,
                       "NCHW", "OIHW", "NCHW", out_dtype or "")
    oh, ow = (conv_out(size + padding[i] + padding[i + 2], f, st, 0, d)  # padding: top, left, bottom, right
              for i, (size, f, st, d) in enumerate(zip((h, wd), (r, s), strides, dilation)))
    return op.permute_dims(op.reshape(out, (n, unfold.frames, k, oh, ow)), [0, 2, 1, 3, 4])

