"""TVM's own tuner as the baseline: MetaSchedule proposes candidates, the core loop measures them.

MetaSchedule keeps its search (design space, evolutionary search, XGBoost cost model) but its
builder only saves each candidate's scheduled IRModule, and its runner hands those files to the
:class:`~opbench.measure.measurer.Measurer` (template ``metaschedule``): every candidate is built,
checked against the reference and timed exactly like an OpBench trial, recorded, and its latency
fed back to MetaSchedule's cost model. A measure callback attaches each candidate's trace.
"""
from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

from opbench._tvm_compat import light_tensor_intrin

light_tensor_intrin()  # before MetaSchedule imports the tensor intrinsics of every backend

import tvm  # noqa: E402
from tvm.ir.utils import derived_object  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder  # noqa: E402
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback  # noqa: E402
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult  # noqa: E402

from opbench.engines._base import ArtifactSink, LoopEngine  # noqa: E402
from opbench.engines.loop import ENGINE_TRIAL_TAG  # noqa: E402
from opbench.hardware.resources import Resources  # noqa: E402
from opbench.hardware.targets import make_target  # noqa: E402
from opbench.measure.measurer import Measurer  # noqa: E402
from opbench.measure.types import TrialSpec  # noqa: E402
from opbench.record import TrialRecord, is_ok  # noqa: E402
from opbench.space.dot_product import repair_tvm_vnni  # noqa: E402
from opbench.space.prescheduled import IR_FILE  # noqa: E402
from opbench.workloads import Workload  # noqa: E402

repair_tvm_vnni()  # MetaSchedule's int8 rule on a VNNI target


@derived_object
class _SaveModuleBuilder(PyBuilder):
    """Writes each candidate's scheduled IRModule to ``<dir>/<n>.json``; the measurer builds it."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__()
        self.out_dir, self.counter = out_dir, itertools.count()

    def build(self, build_inputs: list) -> list:
        results = []
        for inp in build_inputs:
            path = self.out_dir / f"{next(self.counter):05d}.json"
            path.write_text(tvm.ir.save_json(inp.mod))
            results.append(BuilderResult(str(path), None))
        return results


@derived_object
class _Done(PyRunnerFuture):
    def __init__(self, result: RunnerResult) -> None:
        super().__init__()
        self._result = result

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return self._result


@derived_object
class _MeasurerRunner(PyRunner):
    """Measures a batch of saved candidates with the core loop; latency (s) goes back to MetaSchedule."""

    def __init__(self, measure: Callable[[list[str]], list[TrialRecord]]) -> None:
        super().__init__()
        self.measure = measure

    def run(self, runner_inputs: list) -> list:
        records = self.measure([inp.artifact_path for inp in runner_inputs])
        return [_Done(RunnerResult([r["latency_ms"] * 1e-3], None) if is_ok(r)
                      else RunnerResult(None, f"{r['status']}: {r.get('error', '')}")) for r in records]


@derived_object
class _TraceCallback(PyMeasureCallback):
    """Hands each measured candidate's trace to ``sink`` next to its record."""

    def __init__(self, by_file: dict[str, TrialRecord], sink: ArtifactSink) -> None:
        super().__init__()
        self.by_file, self.sink = by_file, sink

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        for candidate, built in zip(measure_candidates, builder_results):
            record = self.by_file.get(built.artifact_path)
            if record is not None:
                trace = Path(built.artifact_path).with_suffix(".trace.py")
                trace.write_text(str(candidate.sch.trace))
                self.sink(record, trace)


class MetaScheduleTuner(LoopEngine):
    """``tvm.s_tir.meta_schedule.tune_tir`` on one workload, measured and recorded by OpBench; every
    candidate's trace and, at the end, MetaSchedule's database go to ``on_artifact``."""

    name = "metaschedule"

    def __init__(self, work_dir: Path | None = None, seed: int | None = None, trials_per_iter: int = 16) -> None:
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="opbench-ms-"))
        self.seed, self.trials_per_iter = seed, trials_per_iter

    def run(self, workload: Workload, trials: int, measurer: Measurer, on_record: Callable[[TrialRecord], None],
            resources: Resources, on_artifact: ArtifactSink | None = None) -> list[TrialRecord]:
        candidates = self.work_dir / "candidates"
        candidates.mkdir(parents=True, exist_ok=True)
        records: list[TrialRecord] = []
        by_file: dict[str, TrialRecord] = {}

        def measure(files: list[str]) -> list[TrialRecord]:
            specs = [TrialSpec(workload, {IR_FILE: f}, resources, self.name,
                               tags={ENGINE_TRIAL_TAG: f"ms{len(records) + i}"}) for i, f in enumerate(files)]
            batch = measurer.measure_batch(specs, on_record=on_record)
            records.extend(batch)
            by_file.update({r[f"knob.{IR_FILE}"]: r for r in batch})
            return batch

        callbacks = [ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()]
        if on_artifact:
            callbacks.append(_TraceCallback(by_file, on_artifact))
        mod = tvm.IRModule({"main": workload.prim_func()})
        ms.tune_tir(mod, make_target(resources.target, resources.threads), str(self.work_dir), trials,
                    num_trials_per_iter=min(self.trials_per_iter, trials), builder=_SaveModuleBuilder(candidates),
                    runner=_MeasurerRunner(measure), measure_callbacks=callbacks, seed=self.seed)
        for path in sorted(self.work_dir.glob("database_*.json")):  # workloads and tuning records with traces
            if on_artifact:
                on_artifact(None, path)
        return records
