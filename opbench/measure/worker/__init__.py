"""Worker processes: the handle the parent holds (:class:`Worker`, in ``process``) and what runs inside
one, by role: ``main`` (the request loop), ``kernel`` (TVM builds and kernels), ``library`` (torch and
numpy baselines, never beside TVM), ``series`` (how a series is sized and timed), ``fork`` (a run in a
child forked for it)."""
from opbench.measure.worker._common import KERNEL, LIBRARY, READY
from opbench.measure.worker.process import Worker, WorkerError

__all__ = ["KERNEL", "LIBRARY", "READY", "Worker", "WorkerError"]
