"""NNI built-in tuners, fixed where they break on OpBench's short trials (used in-process and by nnictl)."""
from __future__ import annotations

from typing import Any

from nni.algorithms.hpo.tpe_tuner import TpeTuner


class OrderSafeTpe(TpeTuner):
    """NNI's TPE tuner, safe when a trial's end reaches it before the trial's result.

    NNI's dispatcher hands trial ends and final results to the tuner from two threads of its own. TPE
    forgets a trial's parameters at its end and raises KeyError on a result that comes after
    (microsoft/nni#5689): the dispatcher dies and the experiment stops proposing. Trials that last a
    second, with a loaded host and concurrent trials, make that order common. Here a late result gets
    its parameters back first; everything else is NNI's TPE.
    """

    def receive_trial_result(self, parameter_id: int, parameters: Any, value: Any, **kwargs: Any) -> None:
        if parameter_id not in self._running_params and parameter_id in self._params:
            self._running_params[parameter_id] = self._params[parameter_id]
        super().receive_trial_result(parameter_id, parameters, value, **kwargs)
