"""Optuna as an engine: the engine (ask/tell, budget, recovery), its storage (a journal file or a database
URL, riding outages) and the heartbeat that lets hosts sharing a study retry a dead host's trials."""
