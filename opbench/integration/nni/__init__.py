"""OpBench under ``nnictl``: the trial command (``trial``) and its HTTP channel to NNI's manager
(``channel``), the experiment files ``opbench nni new`` writes (``experiment``), the model engine as a
custom tuner (``model_tuner``), and the warm measurement service the trials share (``service/``)."""
