"""Studies built on the measurer: tuning runs and their references (``tune``, ``references``), fresh-process
verification (``verify``), thread scaling, co-runs, placement, shared and collaborative studies, and whole
models (``models/``)."""
