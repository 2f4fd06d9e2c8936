"""The record: one trial, a :class:`TrialRecord` wherever the library passes it, and one flat row (a dict,
:meth:`TrialRecord.to_row`) only where a store writes it or a reader reads it back, identical in MLflow,
the write-ahead log and datasets.

Every layer touches it (measure builds it, tracking stores it, engines hear it, studies read it), so
it lives at the bottom beside the exceptions.

Keys are sorted by name into where they live in MLflow: ``PARAMS`` and ``knob.*`` are params,
``METRICS`` are metrics, ``feat.*`` (the ~200 predictor features) go together into one JSON artifact
per run (so the UI's metric columns stay the handful people compare), everything else is a tag.
"""
from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, get_type_hints

SCHEMA_VERSION = 3  # 2: task_key, cpu_model, template_version, features_version; 3: device_key, the estimate over
# placements (latency_lo_ms, latency_hi_ms, placements, placements_agreeing) in place of retakes and turns


class Status(StrEnum):
    """Outcome of a trial; stored as the record's ``status`` tag."""

    OK = "ok"
    INVALID_CONFIG = "invalid_config"
    BUILD_ERROR = "build_error"
    RUN_ERROR = "run_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"
    DEVICE_ERROR = "device_error"  # a remote device: tracker down, no free device, device lost


KNOB_PREFIX = "knob."
FEATURE_PREFIX = "feat."
MEM_PREFIX = "mem."  # what a schedule needs in memory (opbench.measure.memory) ...
WORKSPACE_METRIC = "mem.workspace"  # ... this one an MLflow metric, the others beside the features
JSON_TAGS = ("latencies_ms", "placement_ms", "process_latencies_ms")  # tags whose value is a list, JSON-encoded in MLflow (the
# second a schema-2 baseline's)


def _param(default: Any = "") -> Any:
    return field(default=default, metadata={"kind": "param"})


def _metric() -> Any:
    return field(default=None, metadata={"kind": "metric"})


def _tag(default: Any = None) -> Any:
    return field(default=default, metadata={"kind": "tag"})


@dataclass(eq=False)
class TrialRecord(Mapping[str, Any]):
    """One trial as OpBench records it, and what every layer passes. Built once, where it is measured;
    :meth:`to_row` is the flat row every store and dataset holds (None left out), :meth:`from_row` reads one
    back. Each field's kind says where it lives in MLflow; the column lists :data:`PARAMS`, :data:`METRICS`
    and :data:`TAGS` are derived from it.

    Fields are typed attributes (``record.latency_ms``); the record also reads as the read-only mapping of
    its row (``record["latency_ms"]``, ``record.get("knob.vectorize")``), so code written against rows and
    the public examples keep working. :meth:`set` is the one way to change a column."""

    # what was measured, and where (params)
    workload: str = _param()  # its name: a preset (matmul-512) or OP:key=value,...
    task_key: str = _param()  # what it computes, one key for every name of it (Workload.task_key)
    op: str = _param()  # the operator kind
    shape: str = _param()  # the operator's shape, as its catalogue writes it
    dtype: str = _param()
    template: str = _param()  # the schedule template (or torch, numpy)
    template_version: str = _param()  # a hash of the template's source: schedules of two versions may differ
    threads: int = _param(1)  # threads it ran with
    cores: str = _param("any")  # the core set it was pinned to (any: not pinned)
    target: str = _param()  # the full TVM target it was built for
    host: str = _param()  # the machine it ran on
    cpu_model: str = _param()  # that machine's CPU, as /proc/cpuinfo names it (readable, not precise)
    device_key: str = _param()  # the device precisely: CPU identity, cores, ISA and caches; or GPU name and arch
    tvm_version: str = _param()
    features_version: str = _param()  # the feature extractor that made its feat.* columns (measure.features)
    source_model: str = _param()  # the model the operator comes from, where known
    device: str = _param("local")  # local, or rpc://HOST:PORT/KEY
    device_addr: str | None = _param(None)  # the remote server (HOST:PORT) it ran on
    cache_state: str | None = _param(None)  # warm: the operator alone; cold: every input but the activation evicted
    # before each call, as inside a model (a library baseline: the caches evicted)
    # how long it took (metrics): the latency statistics of its repeats, and throughput
    latency_ms: float | None = _metric()  # the estimate: its fastest placement (per call; docs/measurement.md#placements)
    latency_lo_ms: float | None = _metric()  # its interval: a re-measure in another process lands within it
    latency_hi_ms: float | None = _metric()
    interval_calibration: int | None = _metric()  # re-measures the interval was calibrated by (0: placements alone)
    placements: int | None = _metric()  # independent placements its repeats were taken in
    placement_ms: list[float] | None = _tag()  # each placement's value (the median of its repeats), in order
    placements_agreeing: int | None = _metric()  # of them, those within agree of the fastest, the estimate (0: none)
    latency_ms_mean: float | None = _metric()
    latency_ms_std: float | None = _metric()  # over all repeats: includes the differences between placements
    latency_cv: float | None = _metric()  # the spread of repeats within a placement, pooled over placements
    gflops: float | None = _metric()  # the workload's FLOPs over latency_ms
    peak_frac: float | None = _metric()  # the FLOP/s the schedule computes over the host's measured peak at these threads (none without one)
    build_s: float | None = _metric()  # compiling it
    run_s: float | None = _metric()  # loading, checking and timing it: every attempt
    trial_s: float | None = _metric()  # the whole trial, as its engine waited for it
    finished_at: float | None = _metric()  # unix seconds
    number: int | None = _metric()  # calls per timed repeat
    repeat: int | None = _metric()  # timed repeats kept
    max_abs_err: float | None = _metric()  # largest difference from the reference output
    # measurement quality (docs/measurement.md): the host's load and speed while timing
    load_1m: float | None = _metric()  # the host's 1-minute load average
    other_busy_frac: float | None = _metric()  # the share of its cores other processes kept busy while timing
    host_slowness: float | None = _metric()  # the compute probe over its usual time (1.0 usual; docs/measurement.md#probes)
    host_memory_slowness: float | None = _metric()  # the memory probe's
    host_sync_slowness: float | None = _metric()  # the parallel probe's (a product on each core at once)
    host_exchange_slowness: float | None = _metric()  # the exchange probe's (reading another core's writes)
    host_wait_s: float | None = _metric()  # probing the host, and waiting for its cores to share a cache
    # energy, where a meter could be read (opbench.hardware.energy)
    energy_j: float | None = _metric()  # joules per call
    power_w: float | None = _metric()  # watts while timing
    # co-runs (opbench.measure.corun)
    solo_latency_ms: float | None = _metric()
    slowdown: float | None = _metric()
    makespan_ms: float | None = _metric()
    solo_makespan_ms: float | None = _metric()
    gflops_total: float | None = _metric()
    started_late_ms: float | None = _metric()
    window_s: float | None = _metric()
    # a library baseline reused from an earlier study on this host: its age (opbench.measure.baselines)
    baseline_age_s: float | None = _metric()
    # a model's fused operators (opbench model-ops)
    calls: float | None = _metric()
    share: float | None = _metric()
    flops: float | None = _metric()
    # the outcome and the record's identity (tags)
    status: str = _tag(Status.OK.value)  # ok, invalid_config, build_error, run_error, timeout, wrong_result, device_error
    error: str = _tag("")  # what went wrong, first 4000 characters
    schema_version: int = _tag(SCHEMA_VERSION)
    trial_id: str = field(default_factory=lambda: new_trial_id(), metadata={"kind": "tag"})  # unique per record
    latencies_ms: list[float] | None = _tag()  # every kept repeat (JSON in MLflow)
    study: str | None = _tag()  # the MLflow experiment
    engine: str | None = _tag()  # the engine that proposed it
    record_kind: str | None = _tag()  # corun, verify, ... (empty: a trial)
    corun_id: str | None = _tag()
    corun_mode: str | None = _tag()
    corun_with: str | None = _tag()
    key_op: str | None = _tag()
    # fresh-process verification (opbench verify): which schedule a record re-measures
    verified_as: str | None = _tag()
    worker_pid: int | None = _tag()
    kernel_pid: int | None = _tag()
    reused_from: str | None = _tag()  # the trial id of the baseline this one reuses
    knobs: dict[str, Any] = field(default_factory=dict)  # knob.<name> params
    features: dict[str, float] = field(default_factory=dict)  # feat.<name>: one JSON artifact per run
    memory: dict[str, float] = field(default_factory=dict)  # mem.<name>: bytes (opbench.measure.memory)
    tags: dict[str, Any] = field(default_factory=dict)  # any other column (engine ids, references, ...)
    # columns a row read back lacked (a record of an older schema): left out of its row until they are set
    absent: frozenset[str] = field(default=frozenset(), repr=False)

    def set(self, **values: Any) -> None:
        """Set columns by name: fields where there is one, ``knob.*``, ``feat.*`` and ``mem.*`` in their own
        dicts, other tags otherwise."""
        self.absent -= values.keys()
        for key, value in values.items():
            kept = next((kept for prefix, kept in _PREFIXED if key.startswith(prefix)), None)
            if key in _NAMES:
                setattr(self, key, value)
            elif kept is not None:
                getattr(self, kept)[key.split(".", 1)[1]] = value
            else:
                self.tags[key] = value

    def replace(self, **values: Any) -> TrialRecord:
        """A copy (its own knobs, features, memory and tags) with ``values`` :meth:`set`."""
        copy = replace(self, knobs=dict(self.knobs), features=dict(self.features), memory=dict(self.memory),
                       tags=dict(self.tags))
        copy.set(**values)
        return copy

    def __getitem__(self, key: str) -> Any:
        """The row's column ``key`` (KeyError when it is not set, as the row leaves it out)."""
        if key in _NAMES:
            value = getattr(self, key)
            if value is None or key in self.absent:
                raise KeyError(key)
            return value
        for prefix, kept in _PREFIXED:
            if key.startswith(prefix):
                return getattr(self, kept)[key[len(prefix):]]
        return self.tags[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_row())

    def __eq__(self, other: object) -> bool:
        """Equal to a record or a row with the same columns and values."""
        if not isinstance(other, Mapping):
            return NotImplemented
        return self.to_row() == (other.to_row() if isinstance(other, TrialRecord) else dict(other))

    def __len__(self) -> int:
        return len(self.to_row())

    def to_row(self) -> dict[str, Any]:
        """The flat row: the fields that are set, ``knob.*`` and ``feat.*`` columns and the other tags."""
        row: dict[str, Any] = dict(self.tags)
        row.update({f.name: getattr(self, f.name) for f in _COLUMNS
                    if getattr(self, f.name) is not None and f.name not in self.absent})
        row.update({f"{KNOB_PREFIX}{k}": v for k, v in self.knobs.items()})
        row.update({f"{FEATURE_PREFIX}{k}": v for k, v in self.features.items()})
        row.update({f"{MEM_PREFIX}{k}": v for k, v in self.memory.items()})
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TrialRecord:
        """The record of a row (:meth:`to_row`'s inverse, a row of an older schema included: the columns it lacks
        stay out of the record's row; unknown columns kept in ``tags``)."""
        known = _NAMES
        return cls(**{k: v for k, v in row.items() if k in known}, absent=_DEFAULTED - row.keys(),
                   knobs={k[len(KNOB_PREFIX):]: v for k, v in row.items() if k.startswith(KNOB_PREFIX)},
                   features={k[len(FEATURE_PREFIX):]: v for k, v in row.items() if k.startswith(FEATURE_PREFIX)},
                   memory={k[len(MEM_PREFIX):]: v for k, v in row.items() if k.startswith(MEM_PREFIX)},
                   tags={k: v for k, v in row.items() if k not in known and not k.startswith(_PREFIXES)})


_COLUMNS = tuple(f for f in fields(TrialRecord) if "kind" in f.metadata)
_NAMES = frozenset(f.name for f in _COLUMNS)
_DEFAULTED = frozenset(f.name for f in _COLUMNS if f.default is not None)  # columns a new record always has
_PREFIXED = ((KNOB_PREFIX, "knobs"), (FEATURE_PREFIX, "features"), (MEM_PREFIX, "memory"))
_PREFIXES = tuple(prefix for prefix, _ in _PREFIXED)
_INT_COLUMNS = frozenset(name for name, hint in get_type_hints(TrialRecord).items()
                         if name in _NAMES and hint in (int, int | None))
PARAMS = tuple(f.name for f in _COLUMNS if f.metadata["kind"] == "param")
METRICS = tuple(f.name for f in _COLUMNS if f.metadata["kind"] == "metric")
TAGS = tuple(f.name for f in _COLUMNS if f.metadata["kind"] == "tag")


def kind_of(key: str) -> str:
    """'param', 'metric', 'feature' or 'tag': where ``key`` lives in MLflow."""
    if key in PARAMS or key.startswith(KNOB_PREFIX):
        return "param"
    if key in METRICS or key == WORKSPACE_METRIC:
        return "metric"
    if key.startswith((FEATURE_PREFIX, MEM_PREFIX)):  # the features artifact holds the mem.* columns too
        return "feature"
    return "tag"


def is_numeric(key: str) -> bool:
    """Metrics and features: float columns of a dataset."""
    return kind_of(key) in ("metric", "feature")


def new_trial_id() -> str:
    return uuid.uuid4().hex[:16]


def from_mlflow_value(key: str, value: Any) -> Any:
    """Undo MLflow's stringification of params and tags."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if key in JSON_TAGS:
        return json.loads(value) if isinstance(value, str) else value
    if is_numeric(key):
        return float(value)
    if key in _INT_COLUMNS:
        return int(value)
    if key.startswith(KNOB_PREFIX):
        return _knob_from_text(value)
    return value


def _knob_from_text(value: str) -> Any:
    """A knob kept as text: an integer (``"4"``, or ``"4.0"`` from a table whose column had holes) as an int,
    anything else as the text."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() else value


def is_ok(record: Mapping[str, Any]) -> bool:
    """Whether a trial built, ran and matched its reference (``status`` ok)."""
    return record.get("status") == Status.OK


def ok_records(records: Iterable[TrialRecord], workload: str | None = None) -> list[TrialRecord]:
    """The ok records, of ``workload`` only when it is given."""
    return [r for r in records if is_ok(r) and (workload is None or r.workload == workload)]


def config_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The knob values a record (or a row) was measured with (its ``knob.*`` columns, without the prefix)."""
    if isinstance(record, TrialRecord):
        return dict(record.knobs)
    return {k[len(KNOB_PREFIX):]: v for k, v in record.items() if k.startswith(KNOB_PREFIX)}


def best_ok(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The fastest ok record (lowest median latency), or None when none succeeded."""
    return min(ok_records(records), key=lambda r: r["latency_ms"], default=None)


# What a multi-objective study minimises, as record columns: latency against cores used, joules per call or
# the schedule's workspace bytes.
OBJECTIVE_COLUMNS = {"latency": "latency_ms", "threads": "threads", "energy": "energy_j", "memory": WORKSPACE_METRIC}


def pareto_front(records: Iterable[TrialRecord], objectives: tuple[str, ...]) -> list[TrialRecord]:
    """The ok records with every objective measured that no other such record beats on all of them (each
    minimised; equal on all counts once), ordered by the last objective: every front OpBench reports."""
    columns = [OBJECTIVE_COLUMNS[o] for o in objectives]
    points = [(tuple(float(r[c]) for c in columns), r) for r in ok_records(records)
              if all(r.get(c) is not None for c in columns)]
    front: dict[tuple[float, ...], TrialRecord] = {}
    for values, record in points:
        if not any(other != values and all(o <= v for o, v in zip(other, values)) for other, _ in points):
            front.setdefault(values, record)
    return sorted(front.values(), key=lambda r: tuple(float(r[c]) for c in reversed(columns)))


def speedup(reference: TrialRecord | None, best: TrialRecord | None) -> float:
    """How many times faster ``best`` is than ``reference`` (NaN when either is missing or failed)."""
    if not reference or not best or not is_ok(reference):
        return math.nan
    return reference["latency_ms"] / best["latency_ms"]


def tee(*sinks: Callable[[TrialRecord], object]) -> Callable[[TrialRecord], None]:
    """One record sink that hands each record to every one of ``sinks`` in turn."""
    def sink(record: TrialRecord) -> None:
        for each in sinks:
            each(record)
    return sink


def knob_value(value: object, limit: int = 200) -> object:
    """A knob's value as a record keeps it: a number or a string of at most ``limit`` characters (a
    rejected config may hold anything; MLflow refuses params over 6,000)."""
    if isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."
