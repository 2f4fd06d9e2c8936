"""Features a dataset's older records lack, computed from what they recorded (``opbench dataset featurize``)."""
from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import pandas as pd

from opbench.exceptions import WorkloadError
from opbench.measure.assembly import ASSEMBLY_FEATURES, record_assembly_features
from opbench.measure.features import FEATURES_VERSION, NEST_FEATURES, record_nest_features
from opbench.record import FEATURE_PREFIX, Status

NEST_COLUMNS = tuple(f"{FEATURE_PREFIX}{name}" for name in NEST_FEATURES)
ASSEMBLY_COLUMNS = tuple(f"{FEATURE_PREFIX}{name}" for name in ASSEMBLY_FEATURES)
OLDER_VERSIONS = ("1", "2")  # 1: without the nest features; 2: without the assembly's
PROGRESS_EVERY = 500  # records between two progress lines (each is built again: ~0.3 s on a 2-core host)


@dataclass
class Featurized:
    """What :func:`add_features` did: how many records got the features, and the workloads of those it left as
    they were because their workload no longer parses (a log of an older catalogue) or their kernel no longer
    builds."""

    added: int = 0
    unparsed: dict[str, str] = field(default_factory=dict)  # workload -> why it was left


def add_features(frame: pd.DataFrame, progress: Callable[[int, int], None] = lambda done, total: None,
                 jobs: int = 1) -> tuple[pd.DataFrame, Featurized]:
    """``frame`` with the features of :data:`FEATURES_VERSION` given to every record made before records carried
    them: the compute nest (version 1's lack it) from its config and the CPU it ran on, and the compiled
    assembly's from its kernel built again for the target it was built for; its ``features_version`` brought
    up to date, and what was done. A record that carries them, an invalid config (never built), a record of no
    known version and one whose workload no longer parses keep what they have. ``jobs`` processes build;
    ``progress(done, total)`` is told every :data:`PROGRESS_EVERY` records."""
    done = Featurized()
    if "features_version" not in frame:
        return frame, done
    older = frame.index[frame["features_version"].astype(str).isin(OLDER_VERSIONS) &
                        (frame.get("status", pd.Series("", index=frame.index)) != Status.INVALID_CONFIG.value)]
    records = [record.dropna().to_dict() for _, record in frame.loc[older].iterrows()]
    rows, featurized = [], []
    for count, (index, record, (features, why)) in enumerate(zip(older, records, _featurized(records, jobs)), 1):
        if why:
            done.unparsed.setdefault(str(record["workload"]), why)
        else:
            rows.append(features)
            featurized.append(index)
        if count % PROGRESS_EVERY == 0:
            progress(count, len(older))
    columns = [*NEST_COLUMNS, *ASSEMBLY_COLUMNS]
    out = frame.copy()
    for column in columns:
        if column not in out:
            out[column] = float("nan")
    if rows:
        added = pd.DataFrame(rows, index=featurized, columns=columns)
        out.loc[featurized, columns] = added.combine_first(out.loc[featurized, columns])  # a version 2's nest stays
        out.loc[featurized, "features_version"] = FEATURES_VERSION
    done.added = len(featurized)
    return out, done


def _featurized(records: list[dict], jobs: int) -> Iterator[tuple[dict[str, float], str]]:
    """Each record's missing features, or why it has none, in order (in ``jobs`` processes)."""
    if jobs <= 1:
        yield from map(missing_features, records)
        return
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:  # no fork of TVM's threads
        yield from pool.map(missing_features, records, chunksize=8)


def missing_features(record: dict) -> tuple[dict[str, float], str]:
    """The features an older record lacks (the nest's for version 1, the assembly's for both), or why it gets none
    (its workload no longer parses, or its kernel no longer builds)."""
    try:
        nest = record_nest_features(record) if str(record["features_version"]) == "1" else {}
        return {**nest, **record_assembly_features(record)}, ""
    except WorkloadError as e:
        return {}, str(e)
    except RuntimeError as e:  # TVM's errors: the template no longer schedules or builds the config
        return {}, f"its kernel no longer builds: {str(e).splitlines()[0][:200]}"
