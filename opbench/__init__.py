"""OpBench: benchmark and tune deep-learning operators with Apache TVM, Optuna/NNI and MLflow.

The public API (as ``optuna/__init__.py`` re-exports its own)::

    import opbench
    result = opbench.run_study(opbench.TuneSpec("matmul:m=256,n=256,k=256", trials=16))
    print(result.best["latency_ms"], result.verification.speedup("torch"))

Names are imported when first used, so ``import opbench`` stays light (worker processes that time
library baselines must never import TVM).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from opbench._tvm_compat import leave_torch_to_its_users, light_pool_workers

leave_torch_to_its_users()  # before anything imports TVM
light_pool_workers()

_API = {
    # studies
    "TuneSpec": "opbench.studies.tune", "StudyResult": "opbench.studies.tune", "run_study": "opbench.studies.tune",
    "verify": "opbench.studies.verify", "Verification": "opbench.studies.verify",
    "ModelSpec": "opbench.studies.models.tune", "ModelTuneSpec": "opbench.studies.models.tune",
    "tune_model": "opbench.studies.models.tune",
    # engines
    "EngineSpec": "opbench.engines.registry", "ENGINES": "opbench.engines.registry",
    "create_engine": "opbench.engines.registry",
    # measuring one trial
    "Measurer": "opbench.measure.measurer", "MeasureOptions": "opbench.measure.types",
    "TimingPolicy": "opbench.measure.timing", "TrialSpec": "opbench.measure.types",
    # what is measured, and where
    "parse_workload": "opbench.workloads", "Workload": "opbench.workloads", "get_template": "opbench.space",
    "Resources": "opbench.hardware.resources",
    # records and reading them back
    "TrialRecord": "opbench.record", "Status": "opbench.record", "best_ok": "opbench.record",
    "ok_records": "opbench.record", "read_mlflow": "opbench.tracking", "read_mlflow_records": "opbench.tracking",
    "read_dataset": "opbench.tracking.dataset",
    # errors
    "OpBenchError": "opbench.exceptions",
}
__all__ = [
    "ENGINES",
    "EngineSpec",
    "MeasureOptions",
    "Measurer",
    "ModelSpec",
    "ModelTuneSpec",
    "OpBenchError",
    "Resources",
    "Status",
    "StudyResult",
    "TimingPolicy",
    "TrialRecord",
    "TrialSpec",
    "TuneSpec",
    "Verification",
    "Workload",
    "best_ok",
    "create_engine",
    "get_template",
    "ok_records",
    "parse_workload",
    "read_dataset",
    "read_mlflow",
    "read_mlflow_records",
    "run_study",
    "tune_model",
    "verify",
]

if TYPE_CHECKING:
    from opbench.engines.registry import ENGINES, EngineSpec, create_engine
    from opbench.exceptions import OpBenchError
    from opbench.hardware.resources import Resources
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions, TrialSpec
    from opbench.record import Status, TrialRecord, best_ok, ok_records
    from opbench.space import get_template
    from opbench.studies.models.tune import ModelSpec, ModelTuneSpec, tune_model
    from opbench.studies.tune import StudyResult, TuneSpec, run_study
    from opbench.studies.verify import Verification, verify
    from opbench.tracking import read_mlflow, read_mlflow_records
    from opbench.tracking.dataset import read_dataset
    from opbench.workloads import Workload, parse_workload


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'opbench' has no attribute '{name}'")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
