"""Features -> latency: the XGBoost model (``model``: fit, predict, save, load) and its evaluation."""

# LatencyModel, TaskRanker's objectives, and the pairwise ranker on the compiled kernel's features without
# MetaSchedule's per-store means (it ranked held-out workloads best: docs/cli.md#predictor)
PREDICTORS = ("latency", "normalised", "pairwise", "pairwise-compiled")
