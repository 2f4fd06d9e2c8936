"""Who decides which trial runs next: the Engine contract (``_base``), the registry (``EngineSpec``,
``create_engine``), the tuning loop (``loop``), Optuna (``optuna/``: engine, storage, heartbeat), NNI's
tuners in-process (``nni/``), random and grid (``simple``), the model engine and MetaSchedule."""
