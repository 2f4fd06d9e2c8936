"""A model's transposed convolutions rewritten as ordinary ones before it is fused (docs/workloads-and-templates.md#transposed-convolutions).

TOPI lowers ``conv2d_transpose`` as a stride-1 convolution over the input spread ``stride`` apart: at stride s,
s x s - 1 of every s x s products it computes are by an inserted zero (DCGAN's generator: 4x the work). The
sub-pixel form computes the same outputs without them: output row ``Z = q s + a`` (``Z`` counted from the top
padding) sums ``x[q - v] * w[a + s v]`` over the taps ``v`` of its phase ``a``, so each of the s x s phases is a
stride-1 convolution of the input with a sub-kernel of ``w`` (the kernel zero-padded to a multiple of the stride).
Each phase takes a convolution of its own, padded so that its outputs start at the phase's first output row and
column (a padded layer's phases start at different rows: one convolution of them all, the phases along its output
channels, computes a row and a column more, DCGAN's 4x4 -> 8x8 layer 25 outputs a phase for its 16), except where
a phase has too few output channels to fill a vector (DCGAN's last layer: 3): there the one convolution computes
less. A concatenation and a reshape/transpose interleave the phases (depth to space) and crop what is not output.
On a 1 x 1 input (a latent vector) each output pixel takes one
tap: the layer is a matrix product. The weights are constants, so the sub-kernels are folded at build time; the
convolution takes the catalogue convolution's templates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from opbench.workloads.models.graph import CHANNEL_MULTIPLE, rewrite_calls


@dataclass(frozen=True)
class SubPixel:
    """The sizes of one transposed convolution's sub-pixel form (per spatial dimension: height, width)."""

    size: tuple[int, int]  # the input's
    stride: tuple[int, int]
    taps: tuple[int, int]  # each phase's kernel
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
        return cls(size, stride, taps, out, begin)  # type: ignore[arg-type]

    def rows(self, separate: bool) -> tuple[int, int]:
        """Each convolution's outputs: a phase's own (the output over the stride, rounded up), or, the phases
        stacked, their shared grid from the first padded row to the last one a phase needs (at least the input's)."""
        if separate:
            return tuple(-(-o // st) for o, st in zip(self.out, self.stride))  # type: ignore[return-value]
        return tuple(max(-(-(b + o) // st), n) for b, o, st, n in zip(self.begin, self.out, self.stride, self.size))  # type: ignore[return-value]

    def separate(self, f: int) -> bool:
        """Whether each phase takes a convolution of its own rather than one convolution of every phase (the phases
        along its output channels): where that computes no more multiply-adds, output channels counted in whole
        vectors of :data:`CHANNEL_MULTIPLE` (DCGAN's last layer: 3 channels a phase, a vector's work each)."""
        phases, vector = self.stride[0] * self.stride[1], CHANNEL_MULTIPLE
        own = phases * -(-f // vector) * math.prod(self.rows(True))
        shared = -(-phases * f // vector) * math.prod(self.rows(False))
        return own <= shared

    def conv_signature(self, n: int, c: int, f: int) -> tuple[int, ...]:
        """(n, c, output channels, kernel h, kernel w, out h, out w) of each phase's convolution, or of the one
        convolution of the phases stacked."""
        separate = self.separate(f)
        return (n, c, f if separate else self.stride[0] * self.stride[1] * f, *self.taps, *self.rows(separate))

    def phase(self, dim: int, offset: int) -> PhaseWindow:
        """Along ``dim`` (0: height, 1: width), the phase whose outputs land at ``offset`` modulo the stride (output
        ``z = q' s + offset``): ``z`` is padded row ``begin + z = q s + a`` with ``q = q' + q0``, and ``q`` sums
        ``x[q - v] w[a + s v]``, so that phase convolves the input padded by ``taps - 1 - q0`` before it (cropped
        where that is negative) and after it by enough for its :meth:`rows`."""
        stride, taps, begin, size = self.stride[dim], self.taps[dim], self.begin[dim], self.size[dim]
        a = (offset + begin) % stride
        first = -((a - begin) // stride)  # q0: the first padded row at or after begin in phase a, over the stride
        before = taps - 1 - first
        after = self.rows(True)[dim] + taps - 1 - before - size
        return PhaseWindow(a, max(0, -before), size - max(0, -after), max(0, before), max(0, after))


@dataclass(frozen=True)
class PhaseWindow:
    """One phase's convolution along one dimension: its kernel's phase, the input rows it reads, its padding."""

    kernel_phase: int
    start: int  # it reads the input's rows [start, stop)
    stop: int
    pad_before: int
    pad_after: int


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


def _crop(op: Any, spatial: Any, size: tuple[int, int], begin: tuple[int, int], out: tuple[int, int]) -> Any:
    """``spatial``'s (``size`` rows and columns) from ``begin``, ``out`` of them (itself where that is all of it)."""
    if tuple(begin) == (0, 0) and tuple(size) == tuple(out):
        return spatial
    return op.strided_slice(spatial, [2, 3], list(begin), [b + o for b, o in zip(begin, out)])


def _as_matmul(x: Any, w: Any, sub: SubPixel, out_dtype: Any) -> Any:
    """``out[n, f, y, x] = sum_c x[n, c] w[c, f, y + top, x + left]``: one matrix product, cropped."""
    from tvm.relax import op

    n, (c, f, r, s) = x.ty.shape[0], (int(v) for v in w.ty.shape)
    product = op.matmul(op.reshape(x, (n, c)), op.reshape(w, (c, f * r * s)), out_dtype=out_dtype or "")
    return _crop(op, op.reshape(product, (n, f, r, s)), (r, s), sub.begin, sub.out)


def _as_subpixel_conv(x: Any, w: Any, sub: SubPixel, out_dtype: Any) -> Any:
    """The phases' stride-1 convolutions (:meth:`SubPixel.separate`: each its own ``conv2d``, in the order of the
    output offsets it fills, concatenated along the channels; else one ``conv2d``, the phases along its output
    channels), interleaved and cropped."""
    from tvm.relax import op

    n, (c, f, r, s), (sh, sw), (kh, kw) = x.ty.shape[0], (int(v) for v in w.ty.shape), sub.stride, sub.taps
    if (kh * sh, kw * sw) != (r, s):  # zero taps up to a multiple of the stride
        w = op.nn.pad(w, [0, 0, 0, 0, 0, kh * sh - r, 0, kw * sw - s])
    # w[c, f, v sh + a_y, u sw + a_x] -> the sub-kernel of phase (a_y, a_x), its taps flipped, as OIHW
    kernels = op.permute_dims(op.flip(op.flip(op.reshape(w, (c, f, kh, sh, kw, sw)), 2), 4), [3, 5, 1, 0, 2, 4])
    (h, wd), separate = sub.size, sub.separate(f)
    qh, qw = sub.rows(separate)

    def conv(data: Any, kernel: Any, padding: tuple[int, int, int, int]) -> Any:
        return op.nn.conv2d(data, kernel, 1, padding, 1, 1, "NCHW", "OIHW", "NCHW", out_dtype or "")

    if separate:
        phases = []
        for dy in range(sh):
            for dx in range(sw):
                y, xx = sub.phase(0, dy), sub.phase(1, dx)
                kernel = op.strided_slice(kernels, [0, 1], [y.kernel_phase, xx.kernel_phase],
                                          [y.kernel_phase + 1, xx.kernel_phase + 1])
                data = x if (y.start, y.stop, xx.start, xx.stop) == (0, h, 0, wd) else \
                    op.strided_slice(x, [2, 3], [y.start, xx.start], [y.stop, xx.stop])
                phases.append(conv(data, op.reshape(kernel, (f, c, kh, kw)),
                                   (y.pad_before, xx.pad_before, y.pad_after, xx.pad_after)))
        stacked, begin = op.concat(phases, axis=1), (0, 0)
    else:
        stacked = conv(x, op.reshape(kernels, (sh * sw * f, c, kh, kw)), (kh - 1, kw - 1, qh - h, qw - wd))
        begin = sub.begin
    interleaved = op.permute_dims(op.reshape(stacked, (n, sh, sw, f, qh, qw)), [0, 3, 4, 1, 5, 2])
    return _crop(op, op.reshape(interleaved, (n, f, qh * sh, qw * sw)), (qh * sh, qw * sw), begin, sub.out)
