"""A run of its own in a study's experiment, beside the trial runs (a trained predictor, for one)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from opbench.tracking.mlflow_store import KIND_TAG, default_tracking_uri, ensure_store, experiment_id


def log_run(study: str, name: str, kind: str, params: dict[str, Any], metrics: dict[str, float],
            plots: tuple[Path, ...] = (), xgboost_model: Any = None, tracking_uri: str | None = None) -> str:
    """One finished run named ``name`` (tagged ``kind``) with ``params``, the finite ``metrics``, ``plots`` as
    artifacts and an XGBoost booster logged as an MLflow model; returns its run id."""
    import mlflow

    uri = tracking_uri or default_tracking_uri()
    experiment = experiment_id(ensure_store(uri), study, uri)
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=experiment, run_name=name, tags={KIND_TAG: kind}) as run:
        mlflow.log_params(params)
        mlflow.log_metrics({k: v for k, v in metrics.items() if v == v})
        for plot in plots:
            mlflow.log_artifact(str(plot), "plots")
        if xgboost_model is not None:
            import mlflow.xgboost

            mlflow.xgboost.log_model(xgboost_model, name="model")
        return str(run.info.run_id)
