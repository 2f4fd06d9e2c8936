"""Builds trials in persistent worker processes, several in parallel, each with a timeout; builds kept for
several fresh rounds; built libraries deleted once run."""
from __future__ import annotations

import json
import math
import os
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from opbench import settings
from opbench.hardware.lock import HostLock
from opbench.measure.prepack import manifest_path
from opbench.measure.protocol import BuildInput, BuildResult
from opbench.measure.types import TrialSpec
from opbench.measure.worker import Worker, WorkerError
from opbench.measure.worker.zygotes import one_thread_worker
from opbench.record import Status
from opbench.space import Config

Built = tuple[str, Config, BuildResult]  # (template, validated config, build) of a spec


class LocalBuilder:
    def __init__(self, workers: int = 1, timeout_s: float = settings.BUILD_TIMEOUT_S, lock: HostLock | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = lock
        self._all = [one_thread_worker() for _ in range(max(1, workers))]
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        for worker in self._all:
            self._idle.put(worker)
        self._pool = ThreadPoolExecutor(max_workers=len(self._all), thread_name_prefix="opbench-build")

    def _build_one(self, inp: BuildInput) -> BuildResult:
        worker = self._idle.get()
        try:
            return worker.call(inp, self.timeout_s)
        except WorkerError as exc:
            return BuildResult(Status.TIMEOUT if exc.timed_out else Status.BUILD_ERROR, f"build: {exc}")
        finally:
            self._idle.put(worker)

    def build(self, inputs: list[BuildInput]) -> list[BuildResult]:
        """Build every input; the results keep the inputs' order. Never raises for a bad trial."""
        if not inputs:
            return []
        if self._lock is None:
            return list(self._pool.map(self._build_one, inputs))
        with self._lock.shared():
            return list(self._pool.map(self._build_one, inputs))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for worker in self._all:
            worker.close()


class KeptBuilds:
    """Kernels built once for several rounds of fresh processes (a fresh process is about the process that
    runs a kernel, not its build), by what they depend on (``key``: workload, template, validated config,
    target, threads), and beside them the builds of the ``fastest`` trials offered as they were timed, so a
    study's verification builds none of its contenders again; all deleted by :meth:`discard`."""

    def __init__(self, key: Callable[[TrialSpec], tuple], fastest: int = 0) -> None:
        self._key = key
        self._fastest = fastest
        self._builds: dict[tuple, Built] = {}
        self._offered: dict[tuple, float] = {}  # the latency of each trial's build kept

    def build(self, specs: list[TrialSpec], build: Callable[[list[TrialSpec]], list[Built]]) -> list[Built]:
        """Each spec's build: the one kept, or one ``build`` makes (once per distinct spec), kept if it succeeded."""
        keys = [self._key(spec) for spec in specs]
        todo = {key: spec for key, spec in zip(keys, specs) if key not in self._builds}
        new = dict(zip(todo, build(list(todo.values())))) if todo else {}
        self._builds.update((key, built) for key, built in new.items() if built[2].status is Status.OK)
        return [self._builds.get(key) or new[key] for key in keys]

    def offer(self, spec: TrialSpec, built: Built, latency_ms: float) -> None:
        """A timed trial's build: kept while it is among the ``fastest`` offered, deleted otherwise (or once
        a faster one takes its place, or when its kernel is kept already); keyed by the template and validated
        config the build was made of, so the trial is not validated again."""
        key = build_key(spec, built[0], built[1])
        if key in self._builds or built[2].status is not Status.OK or not latency_ms < math.inf:
            discard(built[2])
            return
        self._builds[key], self._offered[key] = built, latency_ms
        if len(self._offered) > self._fastest:
            slowest = max(self._offered, key=self._offered.__getitem__)
            del self._offered[slowest]
            discard(self._builds.pop(slowest)[2])

    def discard(self) -> None:
        discard(*(build for _, _, build in self._builds.values()))
        self._builds.clear()
        self._offered.clear()


def build_key(spec: TrialSpec, template: str, config: Config) -> tuple:
    """What a kernel's build depends on: workload, template, validated config, target and threads."""
    return (spec.workload.spec, template, json.dumps(config, sort_keys=True, default=repr), spec.resources.target,
            spec.resources.threads)


def discard(*builds: BuildResult) -> None:
    """Delete built libraries once they have run: a long study would otherwise fill the disk."""
    for build in builds:
        for path in (build.artifact, build.artifact and manifest_path(build.artifact)):
            if path and os.path.exists(path):
                os.remove(path)
