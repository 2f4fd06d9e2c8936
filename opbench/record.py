"""The record: one flat dict per trial, identical in MLflow and in the JSON-lines log.

Every layer touches it (measure builds it, tracking stores it, engines hear it, studies read it), so
it lives at the bottom beside the exceptions.

Keys are sorted by name into where they live in MLflow: ``PARAMS`` and ``knob.*`` are params,
``METRICS`` are metrics, ``feat.*`` (the ~200 predictor features) go together into one JSON artifact
per run (so the UI's metric columns stay the handful people compare), everything else is a tag.
"""
from __future__ import annotations

import json
import math
import statistics
import uuid
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

SCHEMA_VERSION = 1
Record = dict[str, Any]


class Status(StrEnum):
    """Outcome of a trial; stored as the record's ``status`` tag."""

    OK = "ok"
    INVALID_CONFIG = "invalid_config"
    BUILD_ERROR = "build_error"
    RUN_ERROR = "run_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"
    DEVICE_ERROR = "device_error"  # a remote device: tracker down, no free device, device lost


PARAMS = ("workload", "op", "shape", "dtype", "template", "threads", "cores", "target", "host",
          "tvm_version", "source_model", "device", "device_addr", "cache_flush")
METRICS = ("latency_ms", "latency_ms_mean", "latency_ms_std", "latency_cv", "gflops", "peak_frac",
           "build_s", "run_s", "trial_s", "finished_at", "number", "repeat", "max_abs_err",
           # measurement quality: attempts repeated for a high CV, the host's load while timing, its
           # speed, its memory's and its threads' in lock step, the one of the probes before and after it
           # furthest from the usual (opbench.hardware.host_speed: 1.0 usual, 1.6 in a slow spell), the runs
           # taken again because a probe found the host outside its usual state, the seconds spent probing
           # and waiting for the usual state, the interleaved turns its repeats were taken in, and those
           # left out of it as a probe found them in a spell while others were not
           "remeasures", "load_1m", "other_busy_frac", "host_slowness", "host_memory_slowness", "host_sync_slowness",
           "spell_reruns", "host_wait_s", "turns", "turns_left_out",
           # energy, where a meter could be read (opbench.hardware.energy)
           "energy_j", "power_w",
           # co-runs (opbench.measure.corun)
           "solo_latency_ms", "slowdown", "makespan_ms", "solo_makespan_ms", "gflops_total", "started_late_ms",
           "window_s",
           # a library baseline reused from an earlier study on this host: its age (opbench.measure.baselines)
           "baseline_age_s",
           # a model's fused operators (opbench model-ops)
           "calls", "share", "flops")
TAGS = ("status", "error", "schema_version", "trial_id", "latencies_ms", "study", "engine",
        "record_kind", "corun_id", "corun_mode", "corun_with", "key_op",
        # fresh-process verification (opbench verify): which schedule a record re-measures, in which round
        "verified_as", "verify_round", "worker_pid", "kernel_pid",
        # a library baseline: the latency in each fresh process it was timed in (its record is the median one)
        "process_latencies_ms", "reused_from")
KNOB_PREFIX = "knob."
FEATURE_PREFIX = "feat."
JSON_TAGS = ("latencies_ms", "process_latencies_ms")  # tags whose value is a list, JSON-encoded in MLflow


def kind_of(key: str) -> str:
    """'param', 'metric', 'feature' or 'tag': where ``key`` lives in MLflow."""
    if key in PARAMS or key.startswith(KNOB_PREFIX):
        return "param"
    if key in METRICS:
        return "metric"
    if key.startswith(FEATURE_PREFIX):
        return "feature"
    return "tag"


def is_numeric(key: str) -> bool:
    """Metrics and features: float columns of a dataset."""
    return kind_of(key) in ("metric", "feature")


def latency_stats(latencies_s: list[float], turn_sizes: list[int] | None = None) -> dict[str, float]:
    """Median, mean and standard deviation of all the repeats (ms), and ``latency_cv``: the spread of the
    repeats within a series. For repeats taken in several turns (``turn_sizes``: each turn's count, in
    order) that is the pooled within-turn standard deviation over the mean, so the host's changes between
    turns, which ``latency_ms_std`` includes, do not count as the series' noise."""
    ms = [t * 1e3 for t in latencies_s]
    if not ms:
        return {}
    mean = statistics.fmean(ms)
    std = statistics.pstdev(ms)
    spread = std
    if turn_sizes and len(turn_sizes) > 1 and sum(turn_sizes) == len(ms) and len(ms) > len(turn_sizes):
        turns, start = [], 0
        for size in turn_sizes:
            turns.append(ms[start:start + size])
            start += size
        squares = sum((x - statistics.fmean(turn)) ** 2 for turn in turns for x in turn)
        spread = math.sqrt(squares / (len(ms) - len(turns)))
    return {"latency_ms": statistics.median(ms), "latency_ms_mean": mean, "latency_ms_std": std,
            "latency_cv": spread / mean if mean else math.nan}


def new_trial_id() -> str:
    return uuid.uuid4().hex[:16]


def column_order(columns: list[str]) -> list[str]:
    """Canonical column order of a dataset: fixed columns, then knobs, then features."""
    fixed = [c for c in (*PARAMS, *METRICS, *TAGS) if c in columns]
    rest = sorted(c for c in columns if c not in fixed)
    knobs = [c for c in rest if c.startswith(KNOB_PREFIX)]
    feats = [c for c in rest if c.startswith(FEATURE_PREFIX)]
    other = [c for c in rest if c not in knobs and c not in feats]
    return fixed + other + knobs + feats


def to_json_value(key: str, value: Any) -> Any:
    """A record value as stored in a JSON line (NaN and infinities become null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def from_mlflow_value(key: str, value: Any) -> Any:
    """Undo MLflow's stringification of params and tags."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if key in JSON_TAGS:
        return json.loads(value) if isinstance(value, str) else value
    if is_numeric(key):
        return float(value)
    if key in ("schema_version", "threads", "cache_flush", "worker_pid", "kernel_pid", "verify_round"):
        return int(value)
    if key.startswith(KNOB_PREFIX):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def is_ok(record: Record) -> bool:
    """Whether a trial built, ran and matched its reference (``status`` ok)."""
    return record.get("status") == Status.OK


def ok_records(records: Iterable[Record], workload: str | None = None) -> list[Record]:
    """The ok records, of ``workload`` only when it is given."""
    return [r for r in records if is_ok(r) and (workload is None or r.get("workload") == workload)]


def config_of(record: Record) -> dict[str, Any]:
    """The knob values a record was measured with (its ``knob.*`` fields, without the prefix)."""
    return {k[len(KNOB_PREFIX):]: v for k, v in record.items() if k.startswith(KNOB_PREFIX)}


def best_ok(records: Iterable[Record]) -> Record | None:
    """The fastest ok record (lowest median latency), or None when none succeeded."""
    return min(ok_records(records), key=lambda r: r["latency_ms"], default=None)


# What a multi-objective study minimises, as record columns: latency against cores used or joules per call.
OBJECTIVE_COLUMNS = {"latency": "latency_ms", "threads": "threads", "energy": "energy_j"}


def pareto_front(records: Iterable[Record], objectives: tuple[str, ...]) -> list[Record]:
    """The ok records with every objective measured that no other such record beats on all of them (each
    minimised; equal on all counts once), ordered by the last objective: every front OpBench reports."""
    columns = [OBJECTIVE_COLUMNS[o] for o in objectives]
    points = [(tuple(float(r[c]) for c in columns), r) for r in ok_records(records)
              if all(r.get(c) is not None for c in columns)]
    front: dict[tuple[float, ...], Record] = {}
    for values, record in points:
        if not any(other != values and all(o <= v for o, v in zip(other, values)) for other, _ in points):
            front.setdefault(values, record)
    return sorted(front.values(), key=lambda r: tuple(float(r[c]) for c in reversed(columns)))


def speedup(reference: Record | None, best: Record | None) -> float:
    """How many times faster ``best`` is than ``reference`` (NaN when either is missing or failed)."""
    if not reference or not best or not is_ok(reference):
        return math.nan
    return reference["latency_ms"] / best["latency_ms"]


def tee(*sinks: Callable[[Record], object]) -> Callable[[Record], None]:
    """One record sink that hands each record to every one of ``sinks`` in turn."""
    def sink(record: Record) -> None:
        for each in sinks:
            each(record)
    return sink
