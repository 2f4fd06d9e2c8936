"""NNI's built-in tuners used in-process (the same classes ``nnictl`` runs behind its manager)."""
from __future__ import annotations

import itertools
import logging
from typing import Any

from opbench.engines._base import InProcessEngine, Proposal, Space, space_point, split_threads
from opbench.exceptions import OpBenchError
from opbench.record import TrialRecord, is_ok

TUNERS = ("TPE", "Anneal", "Evolution", "GridSearch", "Random")
EVOLUTION_POPULATION = 16


def make_tuner(name: str, seed: int | None = None) -> Any:
    """An NNI built-in tuner minimising latency (what an NNI config's ``tuner`` section gives; TPE is
    :class:`~opbench.engines.nni.tuners.OrderSafeTpe`, NNI's own with a fix)."""
    from nni.algorithms.hpo.evolution_tuner import EvolutionTuner
    from nni.algorithms.hpo.gridsearch_tuner import GridSearchTuner
    from nni.algorithms.hpo.hyperopt_tuner import HyperoptTuner
    from nni.algorithms.hpo.random_tuner import RandomTuner

    from opbench.engines.nni.tuners import OrderSafeTpe

    if name == "TPE":
        return OrderSafeTpe("minimize", seed=seed)
    if name == "Anneal":
        return HyperoptTuner("anneal", "minimize")
    if name == "Evolution":
        return EvolutionTuner("minimize", population_size=EVOLUTION_POPULATION)
    if name == "GridSearch":
        return GridSearchTuner()
    if name == "Random":
        return RandomTuner(seed=seed)
    raise OpBenchError(f"unknown NNI tuner '{name}'; tuners: {', '.join(TUNERS)}")


class NniEngine(InProcessEngine):
    """Asks an NNI tuner for parameters and reports latency (ms) back; failures end the trial unsuccessful."""

    def __init__(self, tuner: str, space: Space, threads: int, seed: int | None = None) -> None:
        logging.getLogger("nni").setLevel(logging.WARNING)  # its tuners log every trial at INFO
        self.name = f"nni-{tuner.lower()}"
        self._tuner = make_tuner(tuner, seed)
        self._tuner.update_search_space(space)
        super().__init__(space, threads)
        self._ids = itertools.count()

    def propose(self, n: int) -> list[Proposal]:
        import nni

        out = []
        for _ in range(n):
            parameter_id = next(self._ids)
            try:
                params = self._tuner.generate_parameters(parameter_id)
            except nni.NoMoreTrialError:
                break
            config, threads = split_threads(params, self._threads)
            out.append(Proposal(config, threads, (parameter_id, params)))
        return out

    def refuse(self, proposal: Proposal, reason: str) -> None:
        self._tuner.trial_end(proposal.handle[0], False)

    def learn(self, config: dict[str, Any], threads: int, latency_ms: float) -> None:
        point = space_point(self._space, config, threads)
        if point is not None:
            self._tuner.import_data([{"parameter": point, "value": latency_ms}])

    def hear(self, proposal: Proposal, record: TrialRecord) -> None:
        parameter_id, params = proposal.handle
        ok = is_ok(record)
        if ok:
            self._tuner.receive_trial_result(parameter_id, params, record["latency_ms"])
        self._tuner.trial_end(parameter_id, ok)
