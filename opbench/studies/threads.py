"""Thread scaling: latency vs threads of a workload's default and best configs, speed-up, efficiency,
the turning point (past which one more step of threads adds less than a threshold of speed-up), and a
fit predicting the turning point from op features across workloads."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from opbench.record import KNOB_PREFIX, Record, best_ok, ok_records


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


def best_config(records: list[Record], workload: str) -> dict | None:
    """Knob values of the fastest ok tuning record of ``workload`` (references excluded)."""
    best = best_ok(r for r in ok_records(records, workload)
                   if not r.get("reference") and r.get("template") not in ("te_default", "metaschedule", "torch", "numpy"))
    if best is None:
        return None
    return {k[len(KNOB_PREFIX):]: v for k, v in best.items() if k.startswith(KNOB_PREFIX)}


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
