"""A model-based engine (AutoTVM's xgb-tuner loop): sample many valid configs, rank them with the
latency predictor, measure the most promising batch, retrain on what was measured, repeat.

``warm_start`` (a record table, e.g. other workloads' logs) trains the first model, so the very
first batch is already ranked; with ``update`` False that model is kept and the study's own trials never
retrain it (TenSet's ``xgb-no-update``: what learning from them adds). The model sees only features known
before building (op, config, resources, host), the same for candidates and for logged records.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Any

import numpy as np
import pandas as pd

from opbench.engines._base import InProcessEngine, Proposal, Space, split_threads
from opbench.exceptions import ConfigError
from opbench.hardware.resources import Resources, host_facts
from opbench.measure.features import static_features
from opbench.predictor.model import LatencyModel, feature_columns, trainable
from opbench.record import Status, TrialRecord, is_ok
from opbench.space import Template
from opbench.workloads import Workload


class ModelEngine(InProcessEngine):
    name = "model"

    def __init__(self, space: Space, resources: Resources, workload: Workload, template: Template,
                 seed: int | None = None, warm_start: pd.DataFrame | None = None, pool: int = 512,
                 explore: float = 0.2, update: bool = True) -> None:
        super().__init__(space, resources.threads)
        self._resources, self._workload, self._template = resources, workload, template
        self._rng = random.Random(seed)
        self._seed = seed or 0
        self._host = host_facts()
        self._pool, self._explore, self._update = pool, explore, update
        self._seen: set[str] = set()
        self._measured: list[dict[str, Any]] = []  # feature rows of the trials measured
        self._warm = trainable(warm_start) if warm_start is not None and len(warm_start) else pd.DataFrame()
        self._model: LatencyModel | None = None
        self._trained_on = -1
        probe = static_features(workload, template.default_config(workload), template.name, resources, self._host)
        self._columns = feature_columns(pd.DataFrame([probe]), static_only=True)

    def _features(self, config: dict[str, Any], threads: int) -> dict[str, float]:
        res = dataclasses.replace(self._resources, threads=threads)
        return static_features(self._workload, config, self._template.name, res, self._host)

    def _candidates(self) -> list[tuple[str, dict[str, Any], int]]:
        """Up to ``pool`` distinct valid configs not measured yet (invalid ones are remembered as seen)."""
        out: dict[str, tuple[str, dict[str, Any], int]] = {}
        for _ in range(20 * self._pool):
            if len(out) >= self._pool:
                break
            point = {k: self._rng.choice(v["_value"]) for k, v in self._space.items()}
            key = json.dumps(point, sort_keys=True)
            if key in self._seen or key in out:
                continue
            config, threads = split_threads(point, self._resources.threads)
            try:
                out[key] = (key, self._template.validate(config, self._workload), threads)
            except ConfigError:
                self._seen.add(key)
        return list(out.values())

    @property
    def trained_on(self) -> int:
        """How many records (warm-start plus measured) the current predictor was fitted on; -1 before any."""
        return self._trained_on

    def _refit(self) -> None:
        if not self._update and self._model is not None:
            return
        rows = pd.concat([self._warm, pd.DataFrame(self._measured)], ignore_index=True)
        if len(rows) == self._trained_on or len(rows) < 4 or len(trainable(rows)) < 4:
            return
        self._model = LatencyModel(self._columns, seed=self._seed, n_estimators=200).fit(rows)
        self._trained_on = len(rows)

    def propose(self, n: int) -> list[Proposal]:
        self._refit()
        candidates = self._candidates()
        if self._model is not None and candidates:
            features = pd.DataFrame([self._features(c, t) for _, c, t in candidates])
            order = [int(i) for i in np.argsort(self._model.predict(features))]
            exploit = math.ceil(n * (1 - self._explore))
            rest = order[exploit:]
            picks = order[:exploit] + self._rng.sample(rest, min(n - exploit, len(rest)))
        else:
            picks = list(range(min(n, len(candidates))))
        out = []
        for i in picks[:n]:
            key, config, threads = candidates[i]
            self._seen.add(key)
            out.append(Proposal(config, threads, key))
        return out

    def hear(self, proposal: Proposal, record: TrialRecord) -> None:
        if is_ok(record):
            self.learn(proposal.config, proposal.threads, record["latency_ms"])

    def learn(self, config: dict[str, Any], threads: int, latency_ms: float) -> None:
        """Learn one measured latency (what ``tell`` does, for callers without a full record, e.g. NNI)."""
        self._measured.append({**self._features(config, threads), "status": Status.OK.value, "latency_ms": latency_ms,
                               "workload": self._workload.name})
