"""Worker processes: the handle the parent holds (:class:`Worker`, in ``process``), the zygotes every local
worker is forked from (``zygotes``) and what runs inside one, by role: ``main`` (the request loop, or a zygote's fork
loop), ``kernel`` (TVM builds and kernels), ``library`` (torch and numpy baselines, never beside TVM),
``model`` and ``frameworks`` (whole models), ``layout`` (one address-space layout), ``fork`` (a run in a
child forked for it)."""
from opbench.measure.worker._common import KERNEL, LIBRARY, READY
from opbench.measure.worker.process import Worker, WorkerError

__all__ = ["KERNEL", "LIBRARY", "READY", "Worker", "WorkerError"]
