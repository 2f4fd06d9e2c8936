"""Small scheduling helpers shared by templates (all take a ``tvm.s_tir.Schedule``)."""
from __future__ import annotations

from typing import Any

from opbench.hardware.cpu_shape import current_shape
from opbench.workloads.fused import anchor_block, blocks_after

PREPACK_ANNOTATION = "meta_schedule.layout_rewrite_preproc"  # a weight layout rewrite a model may pre-compute
# Where a packed template's layout transforms run (the ``layout_transform`` knob, one value per operator):
IN_OP = "in_op"  # all inside the operator, timed with it (a catalogue operator: its weight is an input)
WEIGHTS_PREPACKED = "weights_prepacked"  # the weight packed once, untimed, as in a model built with the schedule
LAYOUT_TRANSFORMS = (IN_OP, WEIGHTS_PREPACKED)


def default_layout_transform(op: str) -> str:
    """A model's operator takes its weight packed (a constant); a catalogue one packs it in the op by default."""
    return WEIGHTS_PREPACKED if op.startswith("fused") else IN_OP


# A default register tile's width in vectors (a conv's output channels, a matmul's columns): each value
# broadcast from the other operand feeds this many FMAs, the rest of the accumulators hold its rows
# (docs/workloads-and-templates.md#register-tiles).
TILE_VECTORS = 2


def try_primitive(primitive: Any, block: Any) -> bool:
    """Apply a schedule primitive that may not apply here (a ScheduleError leaves the schedule as it was)."""
    from tvm import s_tir

    try:
        primitive(block)
        return True
    except s_tir.ScheduleError:
        return False


def fold_into_write(sch: Any, epilogue: list[str]) -> None:
    """Fold a fused operator's epilogue stages, in order, into the block that writes its output, up to the first
    that cannot fold: one whose loops are not the shape of what it reads from the stage before (the slice that crops
    a convolution's padded output channels, :func:`~opbench.workloads.models.graph.output_channels_padded`; a padding
    of the output, yolov3-tiny's before its last pooling), which TVM's ``reverse_compute_inline`` would let write
    past its buffer or refuse. That one and those after it run after the operator, inlined into the last where they
    inline, each stage left parallel over its outer loops."""
    for n, name in enumerate(epilogue):
        block = sch.get_sblock(name)
        if _reshapes(sch, block) or not try_primitive(sch.reverse_compute_inline, block):
            inlined = [try_primitive(sch.compute_inline, sch.get_sblock(left)) for left in epilogue[n:-1]]
            for left in [stage for stage, gone in zip(epilogue[n:], [*inlined, False]) if not gone]:
                loops = sch.get_loops(sch.get_sblock(left))
                sch.parallel(sch.fuse(*loops[:2]) if len(loops) > 1 else loops[0])
            return


def _reshapes(sch: Any, block: Any) -> bool:
    """Whether ``block``'s loops differ from the shape of a buffer it reads from a block before it."""
    extents = [int(iv.dom.extent) for iv in sch.get(block).iter_vars]
    return any([int(d) for d in sch.get(producer).writes[0].source.shape] != extents
               for producer in sch.get_producers(block))


def is_reduction(sch: Any, block: Any) -> bool:
    """Whether ``block`` has any non data-parallel iterator."""
    return any(iv.iter_type != 0 for iv in sch.get(block).iter_vars)


def vectorize_inner(sch: Any, block: Any, split_long: bool = True) -> None:
    """Vectorise the innermost loop of ``block`` when it is the block's own and longer than one.

    Call it on blocks whose innermost loop is spatial: non-reduction stages, or a reduction block
    whose loop order puts a spatial loop innermost (its caller knows). A loop that also holds other
    blocks (a stage computed at a loop of its producer, with no loop of its own left) is never
    vectorised: that is not this stage's loop, and TVM 0.27 miscompiles a vectorised loop around a
    reduction and its cache copy (``tests/test_space.py::test_tvm_vectorised_reduction_with_cache_copy_is_miscompiled``).
    Loops longer than a vector register's fp32 lanes (:func:`~opbench.hardware.cpu_shape.current_shape`) are
    split first when ``split_long`` (whole-tensor loops of root stages). Register tiles chosen by a knob
    (``split_long`` False) are vectorised as they are when their extent is a power of two, else only their
    largest power-of-two factor (at most a register's lanes; not at all when that is 1): TVM's 24- and
    48-lane vectors ran 10-35x slower than 16 lanes (docs/workloads-and-templates.md#vector-widths).
    """
    loop = sch.get_loops(block)[-1]
    extent = int(sch.get(loop).extent)
    if extent <= 1 or len(sch.get_child_blocks(loop)) > 1:
        return
    lanes = current_shape().fp32_lanes
    if split_long and extent > lanes:
        loop = sch.split(loop, [None, lanes])[-1]
    elif not split_long and extent & (extent - 1):  # not a power of two
        width = tile_vector_width(extent, lanes)
        if width == 0:
            return
        loop = sch.split(loop, [None, width])[-1]
    sch.vectorize(loop)


def tile_vector_width(extent: int, lanes: int) -> int:
    """The vector a register tile's innermost loop of ``extent`` is built with (:func:`vectorize_inner`,
    ``split_long`` False): all of it when a power of two, else its largest power-of-two factor up to
    ``lanes``; 0 where that is 1 (not vectorised)."""
    width = extent if extent & (extent - 1) == 0 else min(extent & -extent, lanes)
    return width if width > 1 else 0


def vector_lanes(extent: int, lanes: int) -> int:
    """The vector a channel block of ``extent`` is built with (:func:`vectorize_lanes`): all of it when at most a
    register's ``lanes`` (12 lanes ran as fast as 8, where a register tile's rule, :func:`tile_vector_width`, cuts
    them to 4), else that rule's width (an odd extent: its largest divisor up to ``lanes``)."""
    if extent <= lanes:
        return extent
    return tile_vector_width(extent, lanes) or max(d for d in range(1, lanes + 1) if extent % d == 0)


def vectorize_lanes(sch: Any, loop: Any) -> None:
    """Vectorise ``loop`` in :func:`vector_lanes`' width, the vectors of a longer loop unrolled around it: TVM's
    24- and 48-lane vectors ran 2-25x slower than 16 lanes here (docs/workloads-and-templates.md#vector-widths)."""
    extent = int(sch.get(loop).extent)
    width = vector_lanes(extent, current_shape().fp32_lanes)
    if width <= 1:
        return
    if width < extent:
        outer, loop = sch.split(loop, [None, width])
        sch.unroll(outer)
    sch.vectorize(loop)


def vectorize_rows(sch: Any, block: Any, vector: int) -> None:
    """The innermost loop of ``block`` (a row) in vectors of ``vector``, the vectors unrolled."""
    if vector <= 1:
        return
    outer, lanes = sch.split(sch.get_loops(block)[-1], [None, vector])
    sch.unroll(outer)
    sch.vectorize(lanes)


def padded_planes(sch: Any, padding: list[Any], loop: Any) -> None:
    """Each padding stage computed at ``loop`` (a channel's, or a block of channels'): its plane in cache, the
    border filled by a stage of its own so that the copy of the interior has no condition, both by rows of
    vectors (:func:`vector_lanes`)."""
    for block in padding:
        sch.compute_at(block, loop)
        zeros = sch.decompose_padding(block, sch.get_loops(block)[-2])
        for stage in (zeros, block):
            vectorize_rows(sch, stage, vector_lanes(int(sch.get(sch.get_loops(stage)[-1]).extent),
                                                    current_shape().fp32_lanes))


def parallel_outer(sch: Any, block: Any) -> Any:
    """Fuse all but the innermost loop of a root-level ``block`` and parallelise the result."""
    loops = sch.get_loops(block)
    outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(outer)
    return outer


def pack_copy(sch: Any, stage: Any, blocks: dict[int, int], order: tuple[int, ...], parallel: int) -> None:
    """Schedule a packing copy: split its source loops into (outer, block) at ``blocks`` (loop index:
    block), visit the pieces in ``order`` (the packed layout's), fuse and parallelise the first
    ``parallel`` and vectorise the innermost (:func:`vectorize_lanes`)."""
    pieces: list = []
    for index, loop in enumerate(sch.get_loops(stage)):
        pieces.extend(sch.split(loop, [None, blocks[index]]) if index in blocks else [loop])
    loops = [pieces[i] for i in order]
    sch.reorder(*loops)
    sch.parallel(sch.fuse(*loops[:parallel]) if parallel > 1 else loops[0])
    vectorize_lanes(sch, loops[-1])


def mark_prepack(sch: Any, stage: Any) -> None:
    """Mark the copy that packs a weight: in a model, Relax's SplitLayoutRewritePreproc moves it into a
    function of its own that FoldConstant runs once at build time on the constant weight. A
    standalone trial keeps it (and its time) unless its ``layout_transform`` is
    :data:`WEIGHTS_PREPACKED` (:mod:`opbench.measure.prepack` then splits it off the same way)."""
    sch.annotate(stage, PREPACK_ANNOTATION, True)


def loops_below(sch: Any, block: Any, at: Any) -> list[Any]:
    """``block``'s loops inside loop ``at`` (after compute_at, loops of extent 1 are not made)."""
    loops = sch.get_loops(block)
    return loops[[sch.get(loop).same_as(sch.get(at)) for loop in loops].index(True) + 1:]


def inline_around_anchor(sch: Any) -> tuple[Any, Any]:
    """A fused operator's anchor block, its producers (reshapes, transposes, padding) inlined into its reads
    and the blocks after it inlined into the last, which then reads the anchor's output alone: (anchor,
    that last block, or None)."""
    anchor = anchor_block(sch)
    after = blocks_after(sch, anchor)
    for producer in sch.get_producers(anchor):
        sch.compute_inline(producer)
    for name in after[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    return anchor, sch.get_sblock(after[-1]) if after else None
