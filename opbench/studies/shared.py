"""A study that worker hosts join: what ``opbench tune`` publishes on its Optuna study, and
``opbench worker``, which takes the study's trials on another host until its budget is spent.

The study's Optuna user attributes carry its spec, its MLflow parent run, the CPU model it was
started on and the hosts that joined it; a worker needs only the study's name and storage URL. A
journal file or sqlite database is one host's (several hosts' processes must share a database
server: PostgreSQL), and a study's latencies compare only on one CPU model unless told otherwise.
"""
from __future__ import annotations

import json
import os
import socket
import zlib
from dataclasses import dataclass
from typing import Any

from opbench.engines.optuna.storage import is_host_local, open_storage, riding_outages
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import host_facts
from opbench.urls import masked

SPEC_ATTR = "opbench.spec"
PARENT_RUN_ATTR = "opbench.parent_run_id"
CPU_ATTR = "opbench.cpu_model"
HOST_ATTR_PREFIX = "opbench.host:"  # one attribute per host that joined: hosts joining at once all stay
LEGACY_HOSTS_ATTR = "opbench.hosts"  # the list studies published before that still carry


def register_host(study: Any, storage: str, host: str | None = None) -> None:
    """TrialRecord ``host`` (default: this one) among the hosts that joined ``study``. Each host writes a
    key of its own: a shared list rewritten by hosts joining at the same time kept only the last."""
    _set_attrs(study, storage, {f"{HOST_ATTR_PREFIX}{host or socket.gethostname()}": True})


def _set_attrs(study: Any, storage: str, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        riding_outages(lambda: study.set_user_attr(key, value), storage)  # noqa: B023 (called at once)


def study_hosts(attrs: dict[str, Any]) -> list[str]:
    """The hosts that joined a study, from its user attributes."""
    own = {key[len(HOST_ATTR_PREFIX):] for key in attrs if key.startswith(HOST_ATTR_PREFIX)}
    return sorted(own | set(attrs.get(LEGACY_HOSTS_ATTR, [])))


@dataclass(frozen=True)
class WorkerSpec:
    """Join study ``study`` in ``storage`` (a URL all hosts reach), logging to ``tracking_uri``."""

    study: str
    storage: str
    tracking_uri: str | None = None  # default: the study's own (an MLflow server every host reaches)
    log: str | None = None  # also append records to this JSON-lines file on this host
    any_cpu: bool = False  # join although this host's CPU model differs from the study's


def publish(study: Any, storage: str, spec_json: str, parent_run_id: str) -> None:
    """Make ``study`` (in ``storage``) joinable: its spec, parent run, CPU model, and this host as its first."""
    _set_attrs(study, storage, {SPEC_ATTR: spec_json, PARENT_RUN_ATTR: parent_run_id, CPU_ATTR: host_facts().cpu_model})
    register_host(study, storage)


def published_parent(study: Any, storage: str) -> str | None:
    """The MLflow parent run of the invocation that last published ``study`` (None: not published)."""
    return riding_outages(lambda: study.user_attrs, storage).get(PARENT_RUN_ATTR)


def joined_spec(worker: WorkerSpec) -> tuple[str, str]:
    """The study's spec (a TuneSpec's JSON, with this worker's stores) and its parent run id, once
    this host may join: the study exists and was published, its storage and MLflow store reach this
    host, and its CPU model is this host's (or ``any_cpu``). Registers this host on the study."""
    import optuna

    url, storage = masked(worker.storage), open_storage(worker.storage)
    try:
        study = riding_outages(lambda: optuna.load_study(study_name=worker.study, storage=storage), worker.storage)
    except KeyError:
        raise OpBenchError(f"no study '{worker.study}' in {url}; start it with "
                           f"`opbench tune WORKLOAD --study {worker.study} --storage {url}`") from None
    attrs = study.user_attrs
    if SPEC_ATTR not in attrs:
        raise OpBenchError(f"study '{worker.study}' in {url} was not started by `opbench tune`: "
                           "it has no spec for workers to join")
    host, hosts = socket.gethostname(), study_hosts(attrs)
    spec = json.loads(attrs[SPEC_ATTR])
    tracking = worker.tracking_uri or spec["tracking_uri"]
    elsewhere = [h for h in hosts if h != host]
    if elsewhere and is_host_local(worker.storage):
        raise OpBenchError(f"study '{worker.study}' is in {url}, which only one host's processes can share, "
                           f"and it runs on {', '.join(elsewhere)}: for workers on several hosts, store the study in "
                           "PostgreSQL (opbench tune ... --storage postgresql://USER@HOST/DB)")
    if elsewhere and (tracking is None or tracking.startswith("sqlite")):
        raise OpBenchError(f"study '{worker.study}' logs to {tracking or 'the default sqlite store'} on "
                           f"{', '.join(elsewhere)}: give --tracking-uri of an MLflow server every host reaches")
    cpu = host_facts().cpu_model
    if attrs.get(CPU_ATTR) not in (None, cpu) and not worker.any_cpu:
        raise OpBenchError(f"study '{worker.study}' measures on {attrs[CPU_ATTR]}; this host has {cpu}, whose "
                           "latencies do not compare (--any-cpu joins anyway)")
    register_host(study, worker.storage)
    seed = spec["engine"]["seed"]  # a seed of its own: the same seed would propose the same configs again
    seed = None if seed is None else seed + 1 + zlib.crc32(f"{host}:{os.getpid()}".encode()) % 100_000
    spec.update(tracking_uri=tracking, log=worker.log, workers=1, resume=True,
                engine={**spec["engine"], "storage": worker.storage, "seed": seed})
    return json.dumps(spec), attrs[PARENT_RUN_ATTR]
