"""A model study's tuning kept for the next run on the same host: its operators' records, MetaSchedule's
database at equal trials and the frameworks' exports (torch.compile's package, the ONNX file), keyed by
model, shapes, threads, budget, engine, CPU model, TVM version and the templates' sources (``tune-model
--reuse DIR``). A later run with the same key builds and verifies the model from them instead of tuning
again; what it reused is stated (:attr:`TunedCache.note`)."""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from opbench.hardware.resources import host_facts
from opbench.paths import safe_name
from opbench.record import TrialRecord
from opbench.studies.models.profile import OpProfile
from opbench.tracking.jsonl import JsonlWriter, read_jsonl_records

RECORDS, KEY, METASCHEDULE, EXPORTS, PROFILE = "records.jsonl", "key.json", "metaschedule", "exports", "profile.json"


@dataclass(frozen=True)
class ReuseKey:
    """What a model's tuning depends on: a run that differs in any of these tunes again."""

    model: str
    batch: int
    seq_len: int
    threads: int
    trials_per_op: int
    max_ops: int | None
    engine: str  # the engine spec's repr: name, sampler, seed
    device_key: str  # where it was tuned (HostFacts.device_key)
    tvm_version: str
    templates: str  # a hash of every template's source hash: a changed template schedules a config anew
    pipeline: int  # the extraction's PIPELINE_VERSION: a changed fusion makes other operators

    @classmethod
    def here(cls, model: str, batch: int, seq_len: int, threads: int, trials_per_op: int, max_ops: int | None,
             engine: str) -> ReuseKey:
        from opbench.space import TEMPLATES
        from opbench.workloads.models.extract import PIPELINE_VERSION

        host = host_facts()
        sources = ",".join(f"{name}:{template.version}" for name, template in sorted(TEMPLATES.items()))
        return cls(model, batch, seq_len, threads, trials_per_op, max_ops, engine, host.device_key, host.tvm_version,
                   hashlib.sha256(sources.encode()).hexdigest()[:16], PIPELINE_VERSION)

    def folder(self, root: Path) -> Path:
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]
        return root / safe_name(f"{self.model}-{digest}")


class TunedCache:
    """One key's folder under ``root``: the operators' records (op name in the ``reuse.op`` field) and
    MetaSchedule's database folder per trial budget."""

    def __init__(self, root: Path, key: ReuseKey) -> None:
        self.key, self.folder = key, key.folder(root)
        self.reused: list[str] = []  # what this run took from the cache

    def records(self) -> dict[str, list[TrialRecord]] | None:
        """Each operator's records, as the run that tuned it measured them (None: nothing kept)."""
        path = self.folder / RECORDS
        if not path.exists():
            return None
        kept: dict[str, list[TrialRecord]] = {}
        for record in read_jsonl_records(path):
            kept.setdefault(record.tags.pop("reuse.op"), []).append(record)
        self.reused.append(f"operator records of {self._when(path)}")
        return kept

    def save_records(self, records: dict[str, list[TrialRecord]]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / KEY).write_text(json.dumps(asdict(self.key), indent=2))
        partial = self.folder / f"{RECORDS}.partial"
        partial.unlink(missing_ok=True)
        writer = JsonlWriter(partial)
        for op, rows in records.items():
            for record in rows:
                writer.write({**record, "reuse.op": op})
        partial.replace(self.folder / RECORDS)  # whole or absent: a killed run leaves no half cache

    def profile(self) -> dict[str, OpProfile] | None:
        """Each operator's untuned time and memory, as the run that kept them profiled them (None: none kept)."""
        path = self.folder / PROFILE
        if not path.exists():
            return None
        self.reused.append(f"operator profile of {self._when(path)}")
        return {name: OpProfile(**kept) for name, kept in json.loads(path.read_text()).items()}

    def save_profile(self, ops: dict[str, OpProfile]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f"{PROFILE}.partial"
        partial.write_text(json.dumps({name: asdict(op) for name, op in ops.items()}))
        partial.replace(self.folder / PROFILE)

    def metaschedule(self, trials: int) -> Path | None:
        """MetaSchedule's database folder for ``trials`` trials (None: not kept)."""
        folder = self.folder / f"{METASCHEDULE}-{trials}"
        if not folder.is_dir():
            return None
        self.reused.append(f"MetaSchedule's database of {self._when(folder)}")
        return folder

    def save_metaschedule(self, trials: int, database: Path) -> None:
        target = self.folder / f"{METASCHEDULE}-{trials}"
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(database, partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)

    def export(self, name: str, make: Callable[[Path], Path]) -> Path:
        """The export kept as ``name`` (a file name that says what made it, e.g. the torch version), made by
        ``make(path)`` and kept first when there is none; a failed export keeps nothing."""
        kept = self.folder / EXPORTS / name
        if kept.exists():
            self.reused.append(f"{name} of {self._when(kept)}")
            return kept
        partial = kept.with_name(f"partial-{name}")  # the same suffix: AOTInductor wants a .pt2
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        make(partial).replace(kept)
        return kept

    @property
    def note(self) -> str:
        return f"reused from {self.folder}: {', '.join(self.reused)}" if self.reused else ""

    @staticmethod
    def _when(path: Path) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
