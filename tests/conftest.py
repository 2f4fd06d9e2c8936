"""Shared fixtures: one measurer (persistent workers) per test session, private MLflow stores."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Workers inherit the environment: the faulty-kernel plugin must be named before any starts.
os.environ["OPBENCH_PLUGINS"] = "tests.plugins.faulty"
ROOT = Path(__file__).resolve().parents[1]
# Extracted model operators go to a private cache, not the repository's mlflow/models.
os.environ["OPBENCH_MODEL_CACHE"] = tempfile.mkdtemp(prefix="opbench-models-")


@pytest.fixture(scope="session")
def measurer(tmp_path_factory):
    from opbench.measure.measurer import MeasureOptions, Measurer

    options = MeasureOptions(repeat=3, min_repeat_ms=5.0, run_timeout_s=10.0,
                             lock_path=tmp_path_factory.mktemp("lock") / "timing.lock")
    with Measurer(options) as m:
        yield m


@pytest.fixture
def tracking_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
