"""Features -> latency: the XGBoost model (``model``: fit, predict, save, load) and its evaluation."""

# LatencyModel, TaskRanker's objectives, the pairwise ranker on the compiled kernel's features without
# MetaSchedule's per-store means, and that ranker with the normalised regression on the same features and
# the pairwise ranker with the means (RankerEnsemble), and the same with members aimed at a task's fastest configs
# (capped, graded; docs/cli.md#predictor says which ranked held-out workloads best)
PREDICTORS = ("latency", "normalised", "pairwise", "capped", "graded", "pairwise-compiled", "ensemble-compiled",
              "ensemble-capped", "ensemble-near-best")
