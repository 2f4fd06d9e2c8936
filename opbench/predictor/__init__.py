"""Features -> latency: the XGBoost model (``model``: fit, predict, save, load) and its evaluation."""

PREDICTORS = ("latency", "normalised", "pairwise")  # LatencyModel, then TaskRanker's objectives
