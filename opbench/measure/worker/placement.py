"""Where a kernel's arguments live: large ones on transparent huge pages on this host
(docs/measurement.md#huge-pages), the device's own memory elsewhere."""
from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable
from typing import Any

from opbench import settings

HUGE_PAGE_BYTES = 2 << 20
HUGE_PAGE_MIN_BYTES = 256 << 10  # smaller arguments stay where TVM puts them

Place = Callable[[Any], Any]  # a numpy array -> a tensor holding a copy of it
Empty = Callable[[tuple[int, ...], str], Any]  # (shape, dtype) -> a tensor to be written


def argument_placement(dev: Any, on_huge_pages: bool) -> tuple[Place, Empty]:
    """How a run's arguments are made on ``dev``: from arrays, and empty (a prepacked weight); on huge pages
    when ``on_huge_pages`` (a local CPU run), else by TVM on the device (a GPU, a remote session's)."""
    import numpy as np
    import tvm

    if on_huge_pages:
        return on_huge_pages_copy, lambda shape, dtype: on_huge_pages_copy(np.empty(shape, dtype))
    return lambda array: tvm.runtime.tensor(array, dev), lambda shape, dtype: tvm.runtime.empty(shape, dtype, dev)


def on_huge_pages_copy(array: Any) -> Any:
    """A CPU tensor holding a copy of ``array``, on transparent huge pages from a 2 MB boundary when it is
    at least :data:`HUGE_PAGE_MIN_BYTES` (without the ``huge-pages`` isolation: where TVM puts it). Its mapping spans
    whole huge pages: a page the mapping ends inside stays on 4 KB pages."""
    import numpy as np
    import tvm

    if not settings.huge_args() or array.nbytes < HUGE_PAGE_MIN_BYTES:
        return tvm.runtime.tensor(array, tvm.cpu(0))
    whole_pages = -(-array.nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    space = mmap.mmap(-1, whole_pages + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no transparent huge pages: aligned all the same
        space.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(space, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    bits = array.view(np.uint16) if array.dtype.kind == "V" else array  # DLPack has no bfloat16: its bits, viewed back
    view = raw[start:start + array.nbytes].view(bits.dtype).reshape(bits.shape)
    view[...] = bits
    tensor = tvm.runtime.from_dlpack(view)
    return tensor if bits is array else tensor._create_view(array.shape, str(array.dtype))
