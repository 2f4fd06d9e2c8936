"""NNI built-in tuners, fixed where they break on OpBench's short trials (used in-process and by nnictl)."""
from __future__ import annotations

from typing import Any

from nni.algorithms.hpo.tpe_tuner import TpeTuner

LOOKAHEAD_IDS = 1_000_000_000  # parameter ids of the sets issued ahead (NNI numbers its own from 0)


class OrderSafeTpe(TpeTuner):
    """NNI's TPE tuner, safe when a trial's end reaches it before the trial's result, and a trial ahead.

    NNI's dispatcher hands trial ends and final results to the tuner from two threads of its own. TPE
    forgets a trial's parameters at its end and raises KeyError on a result that comes after
    (microsoft/nni#5689): the dispatcher dies and the experiment stops proposing. Trials that last a
    second, with a loaded host and concurrent trials, make that order common. Here a late result gets
    its parameters back first.

    ``lookahead`` parameter sets are issued beyond what NNI's manager asked for (through the
    dispatcher's ``st_callback``, meant for tuners that issue trials when they like), so one always
    waits in the manager's queue. The manager checks its trials every 0.5 s and, in the same pass,
    asks for new parameters and submits what is already queued: without a set waiting, each next
    trial starts one pass (0.5 s) after its parameters arrive. The set waiting was chosen without the
    last trial's result, as with one more trial running (TPE's constant liar covers it).
    """

    def __init__(self, *args: Any, lookahead: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lookahead, self._issued_ahead = lookahead, 0

    def generate_multiple_parameters(self, parameter_id_list: list[int], **kwargs: Any) -> list[Any]:
        issue = kwargs.get("st_callback")
        while issue is not None and self._issued_ahead < self._lookahead:
            parameter_id = LOOKAHEAD_IDS + self._issued_ahead
            self._issued_ahead += 1
            issue(parameter_id, self.generate_parameters(parameter_id))
        return super().generate_multiple_parameters(parameter_id_list, **kwargs)

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        if parameter_id not in self._running_params and parameter_id in self._params:
            self._running_params[parameter_id] = self._params[parameter_id]
        super().receive_trial_result(parameter_id, parameters, value, **kwargs)
