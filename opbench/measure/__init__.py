"""Measuring a trial: the measurer (``measurer``), the one timing policy (``timing``), the wire to its worker
processes (``protocol``), the workers and runners that build and time kernels (``worker/``, ``runner/``), and
the features and memory read from a build."""
