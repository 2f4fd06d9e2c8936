"""Features of a trial: op, schedule config, MetaSchedule per-store summary, resources, host.

Every trial gets the same columns whatever its op kind (missing values are NaN), so one table
holds all trials and a predictor can learn across ops.
"""
from __future__ import annotations

import functools
import math
from typing import Any

from opbench.hardware.resources import HostFacts, Resources
from opbench.space import TEMPLATES, Config
from opbench.workloads import OPERATORS, Workload

FEATURES_VERSION = "1"  # bumped whenever a feature's meaning or the set of features changes (records carry it)
MAX_AXES = 7
MS_FEATURES = 164  # floats per buffer store from MetaSchedule's PerStoreFeature


@functools.cache
def parameter_columns() -> dict[str, tuple[Any, ...] | None]:
    """Union of every template's schedule parameters (with their vocabularies): the config columns
    shared by all records."""
    columns: dict[str, tuple[Any, ...] | None] = {}
    for template in TEMPLATES.values():
        columns.update(template.parameter_vocabulary())
    return dict(sorted(columns.items()))


def op_features(workload: Workload) -> dict[str, float]:
    nan = float("nan")
    axes = workload.axes
    feats = {
        "feat.flops": workload.flops,
        "feat.log_flops": math.log10(max(workload.flops, 1.0)),
        "feat.bytes": workload.bytes,
        "feat.arith_intensity": workload.flops / workload.bytes,
        "feat.n_axes": float(len(axes)),
        "feat.n_reduce_axes": float(sum(a.reduce for a in axes)),
    }
    for i in range(MAX_AXES):
        feats[f"feat.axis{i}"] = float(axes[i].extent) if i < len(axes) else nan
    for name in OPERATORS:
        feats[f"feat.op_{name}"] = float(workload.op.name == name)
    return feats


def config_features(config: Config, workload: Workload, template_name: str | None) -> dict[str, float]:
    """The schedule parameters of a config as numbers: tile sizes as they are, choices as their index
    in the parameter's fixed vocabulary, so one column means the same for every workload."""
    params: Config = {}
    if template_name in TEMPLATES:
        template = TEMPLATES[template_name]
        params = template.parameters({**template.default_config(workload), **config}, workload)
    feats: dict[str, float] = {}
    for name, vocabulary in parameter_columns().items():
        value: Any = params.get(name)
        if value is None:
            feats[f"feat.cfg_{name}"] = float("nan")
        else:
            feats[f"feat.cfg_{name}"] = float(vocabulary.index(value)) if vocabulary else float(value)
    return feats


def resource_features(resources: Resources) -> dict[str, float]:
    return {"feat.threads": float(resources.threads),
            "feat.pinned": float(resources.cores is not None)}


def static_features(workload: Workload, config: Config, template_name: str | None, resources: Resources, host: HostFacts) -> dict[str, float]:
    """Everything known before building: op, config, resources, host."""
    return {**op_features(workload), **config_features(config, workload, template_name), **resource_features(resources), **host.features()}


def per_store_features(mod: Any, target: Any) -> Any:
    """MetaSchedule's PerStoreFeature of a scheduled IRModule: a (buffer stores x :data:`MS_FEATURES`) array."""
    from opbench._tvm_compat import light_tensor_intrin

    light_tensor_intrin()
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    context = ms.TuneContext(mod=mod, target=target)
    candidate = ms.MeasureCandidate(s_tir.Schedule(mod), [])
    return ms.feature_extractor.PerStoreFeature().extract_from(context, [candidate])[0].numpy()


def schedule_features(mod: Any, target: Any) -> dict[str, float]:
    """Mean over buffer stores of MetaSchedule's PerStoreFeature for a scheduled IRModule (in a worker)."""
    per_store = per_store_features(mod, target)
    means = per_store.mean(axis=0) if len(per_store) else [float("nan")] * MS_FEATURES
    feats = {f"feat.ms{i:03d}": float(v) for i, v in enumerate(means)}
    feats["feat.ms_stores"] = float(len(per_store))
    return feats
