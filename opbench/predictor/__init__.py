"""Features -> latency: the XGBoost model (``model``: fit, predict, save, load) and its evaluation."""
