"""A model's transposed convolutions rewritten as ordinary ones before it is fused (docs/workloads-and-templates.md#transposed-convolutions).

TOPI lowers ``conv2d_transpose`` as a stride-1 convolution over the input spread ``stride`` apart: at stride s,
s x s - 1 of every s x s products it computes are by an inserted zero (DCGAN's generator: 4x the work). The
sub-pixel form computes the same outputs without them: output row ``Z = q s + a`` (``Z`` counted from the top
padding) sums ``x[q - v] * w[a + s v]`` over the taps ``v`` of its phase ``a``, so each of the s x s phases is a
stride-1 convolution of the input with a sub-kernel of ``w`` (the kernel zero-padded to a multiple of the stride);
the s x s sub-kernels stacked along the output channels make one ``conv2d``, and a reshape/transpose interleaves
its phases (depth to space) and crops the padding. On a 1 x 1 input (a latent vector) each output pixel takes one
tap: the layer is a matrix product. The weights are constants, so the sub-kernels are folded at build time; the
convolution takes the catalogue convolution's templates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opbench.workloads.models.graph import rewrite_calls


@dataclass(frozen=True)
class SubPixel:
    """The sizes of one transposed convolution's sub-pixel form (per spatial dimension: height, width)."""

    stride: tuple[int, int]
    taps: tuple[int, int]  # each phase's kernel
    rows: tuple[int, int]  # the phases' convolution outputs (q), never fewer than the input's
    out: tuple[int, int]  # the transposed convolution's output
    begin: tuple[int, int]  # where the output starts in the interleaved phases (the top and left padding)

    @classmethod
    def of(cls, size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
           padding: tuple[int, int, int, int], output_padding: tuple[int, int]) -> SubPixel:
        """``padding``: top, left, bottom, right (Relax's order)."""
        begin = padding[:2]
        out = tuple((n - 1) * st - b - e + k + extra
                    for n, st, b, e, k, extra in zip(size, stride, begin, padding[2:], kernel, output_padding))
        taps = tuple(-(-k // st) for k, st in zip(kernel, stride))
        rows = tuple(max(-(-(b + o) // st), n) for b, o, st, n in zip(begin, out, stride, size))
        return cls(stride, taps, rows, out, begin)  # type: ignore[arg-type]

    def conv_signature(self, n: int, c: int, f: int) -> tuple[int, ...]:
        """(n, c, output channels, kernel h, kernel w, out h, out w) of the phases' convolution."""
        return (n, c, self.stride[0] * self.stride[1] * f, *self.taps, *self.rows)


def is_matmul(size: tuple[int, int], output_padding: tuple[int, int]) -> bool:
    """A 1 x 1 input without output padding: one tap per output pixel, a matrix product."""
    return size == (1, 1) and output_padding == (0, 0)


def transposed_convs_as_convs(mod: Any) -> Any:
    """Every NCHW ``conv2d_transpose`` (one group, no dilation, static sizes) as a ``conv2d`` and a depth-to-space
    crop, or on a 1 x 1 input as a ``matmul``; any other left as it is."""
    from tvm.relax.dpl import is_op, wildcard

    data, weight = wildcard(), wildcard()
    deconv = is_op("relax.nn.conv2d_transpose")(data, weight)

    def rewrite(expr: Any, matches: dict[Any, Any]) -> Any:
        x, w, attrs = matches[data], matches[weight], matches[deconv].attrs
        layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
        if layouts != ("NCHW", "IOHW", "NCHW") or int(attrs.groups) != 1 or any(int(d) != 1 for d in attrs.dilation):
            return expr
        try:
            c, h, wd = (int(v) for v in list(x.ty.shape)[1:])
            _, f, r, s = (int(v) for v in w.ty.shape)
        except TypeError:  # a symbolic size
            return expr
        (sh, sw), (eh, ew) = (int(v) for v in attrs.strides), (int(v) for v in attrs.output_padding)
        top, left, bottom, right = (int(v) for v in attrs.padding)
        sub = SubPixel.of((h, wd), (r, s), (sh, sw), (top, left, bottom, right), (eh, ew))
        if is_matmul((h, wd), (eh, ew)):
            return _as_matmul(x, w, sub, attrs.out_dtype)
        return _as_subpixel_conv(x, w, sub, attrs.out_dtype)

    return rewrite_calls(mod, deconv, rewrite)


def _crop(op: Any, spatial: Any, sub: SubPixel) -> Any:
    end = [b + o for b, o in zip(sub.begin, sub.out)]
    return op.strided_slice(spatial, [2, 3], list(sub.begin), end)


def _as_matmul(x: Any, w: Any, sub: SubPixel, out_dtype: Any) -> Any:
    """``out[n, f, y, x] = sum_c x[n, c] w[c, f, y + top, x + left]``: one matrix product, cropped."""
    from tvm.relax import op

    n, (c, f, r, s) = x.ty.shape[0], (int(v) for v in w.ty.shape)
    product = op.matmul(op.reshape(x, (n, c)), op.reshape(w, (c, f * r * s)), out_dtype=out_dtype or "")
    return _crop(op, op.reshape(product, (n, f, r, s)), sub)


def _as_subpixel_conv(x: Any, w: Any, sub: SubPixel, out_dtype: Any) -> Any:
    """The phases' stride-1 convolutions as one ``conv2d`` (phases along its output channels), interleaved, cropped."""
    from tvm.relax import op

    n, (c, f, r, s), (sh, sw), (kh, kw), (qh, qw) = x.ty.shape[0], (int(v) for v in w.ty.shape), sub.stride, sub.taps, sub.rows
    if (kh * sh, kw * sw) != (r, s):  # zero taps up to a multiple of the stride
        w = op.nn.pad(w, [0, 0, 0, 0, 0, kh * sh - r, 0, kw * sw - s])
    # w[c, f, v sh + a_y, u sw + a_x] -> the sub-kernel of phase (a_y, a_x), its taps flipped, as OIHW
    split = op.flip(op.flip(op.reshape(w, (c, f, kh, sh, kw, sw)), 2), 4)
    kernels = op.reshape(op.permute_dims(split, [3, 5, 1, 0, 2, 4]), (sh * sw * f, c, kh, kw))
    h, wd = (int(v) for v in list(x.ty.shape)[2:])
    phases = op.nn.conv2d(x, kernels, 1, (kh - 1, kw - 1, qh - h, qw - wd), 1, 1, "NCHW", "OIHW", "NCHW", out_dtype or "")
    interleaved = op.permute_dims(op.reshape(phases, (n, sh, sw, f, qh, qw)), [0, 3, 4, 1, 5, 2])
    return _crop(op, op.reshape(interleaved, (n, f, qh * sh, qw * sw)), sub)
