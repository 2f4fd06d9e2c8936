"""Schedules made elsewhere: a tuner's candidate saved as a scheduled IRModule in TVM's JSON."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opbench.exceptions import ConfigError
from opbench.space._base import Config, Knob, Template
from opbench.workloads import Workload

if TYPE_CHECKING:
    from tvm import IRModule
    from tvm.s_tir import Schedule

IR_FILE = "ir_file"


@dataclass(frozen=True)
class IRFileTemplate(Template):
    """Measures a scheduled IRModule read from ``config["ir_file"]`` (MetaSchedule's candidates).

    It has no knobs: the whole schedule is the file, built and checked like any other trial.
    """

    name: str = "metaschedule"

    def knobs(self, workload: Workload) -> list[Knob]:
        return []

    def default_config(self, workload: Workload) -> Config:
        return {}

    def validate(self, config: Config, workload: Workload) -> Config:
        extra = set(config) - {IR_FILE}
        if extra:
            raise ConfigError(sorted(extra)[0], f"template '{self.name}' takes only '{IR_FILE}'")
        self.check(config, workload)
        return {IR_FILE: str(config[IR_FILE])}

    def check(self, config: Config, workload: Workload) -> None:
        path = config.get(IR_FILE)
        if not path or not Path(path).is_file():
            raise ConfigError(IR_FILE, f"needs an existing scheduled-IRModule JSON file, got {path!r}")

    def apply(self, sch: Schedule, config: Config, workload: Workload) -> None:
        raise TypeError(f"template '{self.name}' replaces the whole module: use schedule(), not apply()")

    def schedule(self, workload: Workload, config: Config) -> IRModule:
        import tvm

        return tvm.ir.load_json(Path(config[IR_FILE]).read_text())
