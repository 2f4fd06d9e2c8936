"""OpBench's model engine as a custom NNI tuner, for ``nnictl`` users.

In an NNI config (``opbench nni new WORKLOAD --tuner Model`` writes it)::

    tuner:
      codeDirectory: ../..        # the project root, so NNI's dispatcher can import opbench
      className: opbench.integration.nni.model_tuner.ModelTuner
      classArgs: {workload: matmul-512, threads: 2, seed: 0, warm_start: /abs/path/old-logs.parquet}

NNI's dispatcher asks for one parameter set at a time; the tuner ranks a batch of candidates with the
latency predictor (retrained on every result so far, plus the warm-start logs) and hands them out in
order. Results arrive as the trial's ``default`` metric (latency in ms, see ``nni_trial``).
"""
from __future__ import annotations

import json
from typing import Any

from nni.tuner import Tuner

from opbench.engines._base import Proposal
from opbench.engines.model_engine import ModelEngine
from opbench.hardware.resources import Resources
from opbench.plugins import load_plugins
from opbench.space import get_template
from opbench.workloads import parse_workload


class ModelTuner(Tuner):
    """NNI ``Tuner`` over :class:`ModelEngine`; proposals come in ranked batches of ``batch``."""

    def __init__(self, workload: str, threads: int = 1, template: str | None = None, seed: int | None = 0,
                 warm_start: str | None = None, batch: int = 8) -> None:
        load_plugins()  # NNI's dispatcher process is an entry point of its own
        self._workload = parse_workload(workload)
        self._template = get_template(self._workload, template)
        self._resources = Resources(threads)
        self._seed, self._warm_start, self._batch = seed, warm_start, batch
        self._engine: ModelEngine | None = None
        self._queue: list[Proposal] = []
        self._issued: dict[int, Proposal] = {}

    @property
    def engine(self) -> ModelEngine | None:
        return self._engine

    def update_search_space(self, search_space: dict[str, Any]) -> None:
        from opbench.tracking.dataset import read_dataset

        warm = read_dataset(self._warm_start) if self._warm_start else None
        self._engine = ModelEngine(search_space, self._resources, self._workload, self._template, self._seed, warm)
        self._queue.clear()

    def generate_parameters(self, parameter_id: int, **kwargs: Any) -> dict[str, Any]:
        import nni

        if self._engine is None:
            raise RuntimeError("ModelTuner: NNI sent no search space")
        if not self._queue:
            self._queue = self._engine.ask(self._batch)
        if not self._queue:
            raise nni.NoMoreTrialError("the search space has no unmeasured valid config left")
        proposal = self._queue.pop(0)
        self._issued[parameter_id] = proposal
        return json.loads(proposal.handle)  # the point as NNI's search space names it (with 'threads' if searched)

    def receive_trial_result(self, parameter_id: int, parameters: dict[str, Any], value: Any, **kwargs: Any) -> None:
        proposal = self._issued.pop(parameter_id)
        latency = value["default"] if isinstance(value, dict) else value
        assert self._engine is not None, "NNI reports results only of parameters this tuner generated"
        self._engine.learn(proposal.config, proposal.threads, float(latency))

    def trial_end(self, parameter_id: int, success: bool, **kwargs: Any) -> None:
        self._issued.pop(parameter_id, None)  # a failed trial teaches nothing; a finished one was received
