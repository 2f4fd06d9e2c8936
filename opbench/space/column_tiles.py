"""Register tiles along a convolution's output width (docs/workloads-and-templates.md#packed): its divisors, and
where none is wide enough, tiles that do not divide it, the last one predicated; and the default tile's vectors of
output channels by columns (#register-tiles)."""
from __future__ import annotations

from opbench.hardware.cpu_shape import CpuShape
from opbench.space._base import divisors

OW_BLOCK_CAP = 16  # the widest tile
# An output width whose divisors leave a register tile narrower than this also takes tiles that do not divide it
# (the last one predicated): 17 columns (Inception-v3's 17x17 stage) otherwise leaves a tile of one column. A
# predicated tile keeps its accumulators in memory, so a divisor of 3 is kept (docs/workloads-and-templates.md#column-tiles).
NARROWEST_TILE = 3
COVERING_CAP = 8  # the widest such tile


def column_tiles(width: int, predicated: bool = True) -> tuple[int, ...]:
    """Register tiles along an output width of ``width``: its divisors up to :data:`OW_BLOCK_CAP`, and (where
    ``predicated``) where the widest of them is narrower than :data:`NARROWEST_TILE`, tiles up to
    :data:`COVERING_CAP` that do not divide it."""
    exact = divisors(width, OW_BLOCK_CAP)
    if exact[-1] >= NARROWEST_TILE or not predicated:
        return exact
    return tuple(sorted({*exact, *(b for b in range(2, min(COVERING_CAP, width - 1) + 1) if width % b)}))


def default_column_tile(width: int, columns: int, predicated: bool) -> int:
    """The widest dividing tile that ``columns`` accumulators hold; where it is too narrow, the tile of at least
    :data:`NARROWEST_TILE` that leaves the fewest predicated columns (the wider of two that tie)."""
    fits = [b for b in column_tiles(width, predicated) if b <= columns]
    widest = max(b for b in fits if width % b == 0)
    covering = [b for b in fits if b >= NARROWEST_TILE]
    if widest >= NARROWEST_TILE or not covering:
        return widest
    return min(covering, key=lambda b: (-(-width // b) * b - width, -b))


def loads_per_fma(vectors: int, columns: int) -> float:
    """Loads a step of a direct convolution's register tile issues for each FMA: ``vectors`` weight vectors and
    ``columns`` broadcast data values feed ``vectors x columns`` FMAs."""
    return (vectors + columns) / (vectors * columns)


def default_register_tile(width: int, vector_counts: tuple[int, ...], shape: CpuShape,
                          predicated: bool) -> tuple[int, int]:
    """(vectors, columns) of a direct convolution's register tile: for each count of weight vectors,
    :func:`default_column_tile` of the columns the registers beside them and the broadcast value hold; of those,
    the tile with the fewest :func:`loads_per_fma` (the first of ``vector_counts`` where two tie). With 16 AVX2
    registers, two vectors hold 6 columns: a 7-wide output takes one column of two vectors (3 loads for 2 FMAs)
    or seven of one (8 for 7)."""
    tiles = [(vectors, default_column_tile(width, shape.accumulators_beside(vectors + 1) // vectors, predicated))
             for vectors in vector_counts]
    return min(tiles, key=lambda tile: loads_per_fma(*tile))
