"""Thread scaling: latency vs threads of a workload's default and best configs, speed-up, efficiency,
the turning point (past which one more step of threads adds less than a threshold of speed-up), and a
fit predicting the turning point from op features across workloads."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opbench import settings
from opbench.exceptions import OpBenchError
from opbench.record import TrialRecord, is_ok, tee


@dataclass
class Scaling:
    workload: str
    config_name: str  # "default" or "best"
    threads: list[int]
    latency_ms: list[float]
    features: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> list[float]:
        return [self.latency_ms[0] / t for t in self.latency_ms]

    @property
    def efficiency(self) -> list[float]:
        return [s * self.threads[0] / t for s, t in zip(self.speedup, self.threads)]

    def turning_point(self, threshold: float = 0.1) -> int:
        """The thread count after which the next step adds less than ``threshold`` relative speed-up."""
        s = self.speedup
        for i in range(len(s) - 1):
            if not s[i + 1] / s[i] - 1 >= threshold:
                return self.threads[i]
        return self.threads[-1]


def fit_turning_points(scalings: list[Scaling], threshold: float) -> tuple[dict[str, float], float] | None:
    """Linear fit of the turning point on log FLOPs and arithmetic intensity: coefficients and R²."""
    if len(scalings) < 3:
        return None
    import numpy as np
    from sklearn.linear_model import LinearRegression

    x = np.array([[s.features["feat.log_flops"], math.log10(s.features["feat.arith_intensity"])] for s in scalings])
    y = np.array([s.turning_point(threshold) for s in scalings], dtype=float)
    model = LinearRegression().fit(x, y)
    r2 = float(model.score(x, y)) if y.std() > 0 else math.nan
    return {"intercept": float(model.intercept_), "log_flops": float(model.coef_[0]),
            "log_arith_intensity": float(model.coef_[1])}, r2


@dataclass(frozen=True)
class ThreadStudySpec:
    """Thread scaling of ``workloads``' default configs (and best ones from ``best_from`` studies)."""

    workloads: tuple[str, ...]
    threads: tuple[int, ...]
    study: str = "threads-study"
    tracking_uri: str | None = None
    best_from: tuple[str, ...] = ()
    repeat: int = settings.REPEAT

    def __post_init__(self) -> None:
        if len(set(self.threads)) < 2:
            raise OpBenchError(f"--threads needs at least two thread counts to show scaling, got {list(self.threads)}")


@dataclass
class ThreadStudyResult:
    scalings: list[Scaling]
    plots: list[Path]


def run_thread_study(spec: ThreadStudySpec, on_record: Callable[[TrialRecord], None] | None = None) -> ThreadStudyResult:
    """Measure every config at every thread count; one plot per workload (a file and an MLflow artifact)."""
    from opbench.hardware.resources import Resources
    from opbench.measure.features import op_features
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions, TrialSpec
    from opbench.paths import safe_name
    from opbench.report.plots import thread_scaling
    from opbench.space import get_template
    from opbench.studies.configs import best_config
    from opbench.tracking import Recorder, read_mlflow_records
    from opbench.tracking.mlflow_store import study_dir
    from opbench.workloads import parse_workload

    threads = sorted(set(spec.threads))
    earlier = read_mlflow_records(list(spec.best_from), spec.tracking_uri) if spec.best_from else []
    result = ThreadStudyResult([], [])
    with Measurer(MeasureOptions(TimingPolicy(repeat=spec.repeat))) as measurer, \
            Recorder(spec.study, spec.tracking_uri, extra={"engine": "threads-study"}) as recorder:
        sink = tee(recorder, *filter(None, [on_record]))
        for name in spec.workloads:
            workload = parse_workload(name)
            configs = {"default": get_template(workload).default_config(workload)}
            if (best := best_config(earlier, workload.name)) is not None:
                configs["best"] = best
            mine = []
            for label, config in configs.items():
                latencies = []
                for t in threads:
                    record = measurer.measure(TrialSpec(workload, config, Resources(t), tags={"scaling_config": label}))
                    sink(record)
                    latencies.append(record["latency_ms"] if is_ok(record) else math.nan)
                mine.append(Scaling(workload.name, label, threads, latencies, op_features(workload)))
            plot = thread_scaling({s.config_name: (s.threads, s.latency_ms, s.efficiency) for s in mine},
                                  f"{workload.name}: thread scaling",
                                  study_dir("plots", spec.study, recorder.uri) / f"{safe_name(workload.name)}.png")
            recorder.log_artifact(plot, "plots")
            result.scalings += mine
            result.plots.append(plot)
    return result
