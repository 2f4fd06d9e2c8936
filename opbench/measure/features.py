"""Features of a trial: op, schedule config, MetaSchedule per-store summary, resources, host.

Every trial gets the same columns whatever its op kind (missing values are NaN), so one table
holds all trials and a predictor can learn across ops.
"""
from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Mapping
from typing import Any

from opbench.exceptions import ConfigError
from opbench.hardware.cpu_shape import CpuShape, record_shape, shaped_for, target_shape
from opbench.hardware.resources import HostFacts, Resources
from opbench.record import KNOB_PREFIX, config_of, from_mlflow_value
from opbench.space import TEMPLATES, Config, Nest
from opbench.workloads import OPERATORS, Workload, parse_workload

FEATURES_VERSION = "3"  # bumped whenever a feature's meaning or the set of features changes (records carry it)
# 2: the compute-nest features; 3: the compiled assembly's (measure.assembly)
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


NEST_FEATURES = ("nest_tile", "nest_acc_regs", "nest_vector", "nest_vector_fill", "nest_vector_pow2",
                 "nest_fma_per_load", "nest_reduce", "nest_parallel", "nest_parallel_balance")


def nest_features(nest: Nest | None, threads: int, shape: CpuShape) -> dict[str, float]:
    """A config's compute nest in the CPU's terms, alike for every template (NaN where the template does not
    describe it): accumulators against the registers that hold them, the vector against a register's lanes
    and whether it is a power of two (other widths ran 10-35x slower, docs/workloads-and-templates.md#vector-widths),
    vector FMAs per load in one reduction step, the reduction chunk, and how evenly the parallel loop's
    iterations fill the threads."""
    if nest is None:
        return {f"feat.{name}": math.nan for name in NEST_FEATURES}
    lanes, rows, last = shape.fp32_lanes, nest.rows, nest.columns
    vectors = math.ceil(last / lanes) if nest.vector else last  # accumulators of the vectorised loop
    loads = rows + (math.ceil(last / min(nest.vector, lanes)) if nest.vector else last)
    rounds = math.ceil(nest.parallel / threads)
    values = {
        "nest_tile": float(rows * last),
        "nest_acc_regs": rows * vectors / shape.accumulator_registers,
        "nest_vector": float(nest.vector),
        "nest_vector_fill": nest.vector / lanes,
        "nest_vector_pow2": float(nest.vector > 0 and nest.vector & (nest.vector - 1) == 0),
        "nest_fma_per_load": rows * vectors / loads,
        "nest_reduce": float(nest.reduce),
        "nest_parallel": float(nest.parallel),
        "nest_parallel_balance": nest.parallel / (rounds * threads),
    }
    return {f"feat.{name}": values[name] for name in NEST_FEATURES}


def config_nest(config: Config, workload: Workload, template_name: str | None) -> Nest | None:
    """The compute nest of a validated config of ``template_name`` on ``workload`` (None: no such template, or
    no config)."""
    template = TEMPLATES.get(template_name or "")
    return template.nest(config, workload) if template is not None and config else None


def record_config(record: Mapping[str, Any]) -> Config:
    """A record's knobs as its template takes them (a dataset keeps some as text, and NaN for another template's
    knobs in the same table)."""
    return {k: from_mlflow_value(KNOB_PREFIX + k, v) if isinstance(v, str) else v
            for k, v in config_of(record).items() if v == v}


def record_nest(record: Mapping[str, Any]) -> Nest | None:
    """The compute nest of a record's config on the CPU it ran on (:func:`record_shape`), knobs it lacks (an older
    template's record) at their defaults; None where its template is unknown or no longer takes its config."""
    workload, template = parse_workload(record["workload"]), TEMPLATES.get(record.get("template") or "")
    with shaped_for(record_shape(record)), contextlib.suppress(ConfigError):  # the defaults completing the config: that CPU's
        return template.nest(template.validate(record_config(record), workload), workload) if template else None
    return None


def record_nest_features(record: Mapping[str, Any]) -> dict[str, float]:
    """:func:`nest_features` of :func:`record_nest`, for records made before they carried them
    (:data:`FEATURES_VERSION` 1)."""
    return nest_features(record_nest(record), int(record["threads"]), record_shape(record))


def resource_features(resources: Resources) -> dict[str, float]:
    return {"feat.threads": float(resources.threads),
            "feat.pinned": float(resources.cores is not None)}


def static_features(workload: Workload, config: Config, template_name: str | None, resources: Resources, host: HostFacts) -> dict[str, float]:
    """Everything known before building: op, config, resources, host."""
    nest = nest_features(config_nest(config, workload, template_name), resources.threads,
                         target_shape(resources.target, host))
    return {**op_features(workload), **config_features(config, workload, template_name), **nest,
            **resource_features(resources), **host.features()}


def per_store_features(mod: Any, target: Any) -> Any:
    """MetaSchedule's PerStoreFeature of a scheduled IRModule: a (buffer stores x :data:`MS_FEATURES`) array. A
    weight layout rewrite the schedule marks is split off first, as a model runs it (PerStoreFeature leaves out
    a marked copy itself, but fails on a marked computation such as Winograd's weight transform)."""
    from opbench._tvm_compat import light_tensor_intrin

    light_tensor_intrin()
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from opbench.measure.prepack import MAIN, split_prepack

    split, prepack = split_prepack(mod)
    if prepack is not None:
        mod = tvm.IRModule({MAIN: split[MAIN]})
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
