"""The systems a tuned model is verified against, each prepared once so that the fresh processes that time
it only load it: TVM's default lowering (``untuned``), the template defaults (``defaults``), MetaSchedule
with the tuned model's trial count (``metaschedule``), PyTorch eager (``torch``), ``torch.compile`` (an
AOTInductor package), ONNX Runtime and OpenVINO (an exported ONNX file), zentorch (AMD's backend for
``torch.compile``, on AMD CPUs with AVX-512) and ``torch-sparse`` (a model's sparse form in PyTorch, the GCN's:
beside the baselines, not one of them). A system that cannot be prepared, or cannot run on this host,
stays in the table with the reason (:class:`Prepared`)."""
from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, host_facts
from opbench.measure.models import export_model
from opbench.measure.protocol import INDUCTOR, ONNXRUNTIME, OPENVINO, TORCH_INT8, TORCH_SPARSE, ZENTORCH, ModelInput
from opbench.studies.models.profile import ModelProfile
from opbench.studies.models.reuse import TunedCache
from opbench.studies.models.tuned import apply_database
from opbench.workloads.models.quantize import is_quantized
from opbench.workloads.models.sources import ModelSource

log = logging.getLogger("opbench")

UNTUNED, DEFAULTS, METASCHEDULE, EAGER_ROW = "untuned", "defaults", "metaschedule", "torch"
SYSTEMS = (UNTUNED, DEFAULTS, METASCHEDULE, EAGER_ROW, INDUCTOR, ONNXRUNTIME, OPENVINO, ZENTORCH, TORCH_SPARSE, TORCH_INT8)
FRAMEWORK_ROWS = (EAGER_ROW, INDUCTOR, ONNXRUNTIME, OPENVINO, ZENTORCH, TORCH_INT8)  # what a user would pick instead of TVM


def parse_systems(value: str) -> tuple[str, ...]:
    """``--compare``: comma-separated names from :data:`SYSTEMS`."""
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise OpBenchError(f"unknown system {', '.join(unknown) or repr(value)}; systems: {', '.join(SYSTEMS)}")
    return names


@dataclass
class Prepared:
    runs: dict[str, ModelInput] = field(default_factory=dict)  # each system's run, ready for a fresh process
    failed: dict[str, str] = field(default_factory=dict)  # a system that could not be prepared: why
    notes: dict[str, str] = field(default_factory=dict)  # how a system was prepared, where it matters


def prepare_systems(systems: tuple[str, ...], prof: ModelProfile, model: str, batch: int, seq_len: int,
                    threads: int, target: Any, folder: Path, trials: int, cache: TunedCache | None = None) -> Prepared:
    """Each of ``systems`` (names from :data:`SYSTEMS`) made ready to time with ``threads`` threads;
    MetaSchedule gets ``trials`` trials (the tuned model's), its database kept in and reused from ``cache``."""
    from opbench.workloads.models.exports import inductor_package

    resources, inputs = Resources(threads), str(prof.inputs)
    prepared = Prepared()
    for system in systems:
        try:
            if system == UNTUNED:
                assert prof.untuned_library is not None, "the profile built no untuned model"
                prepared.runs[system] = ModelInput(model, library=str(prof.untuned_library), inputs=inputs,
                                                   resources=resources)
            elif system == DEFAULTS:
                from opbench.studies.models.scheduled import defaults_database

                database = defaults_database(prof, model, batch, seq_len, target, folder / DEFAULTS)
                library = export_model(apply_database(prof.mod, database, target), target, folder / f"{DEFAULTS}.so")
                prepared.runs[system] = ModelInput(model, library=str(library), inputs=inputs, resources=resources)
            elif system == METASCHEDULE:
                from opbench.studies.models.metaschedule import metaschedule_model

                log.info("%s: MetaSchedule, %d trials", model, trials)
                tuned = metaschedule_model(prof.mod, target, folder, trials, cache)
                prepared.runs[system] = ModelInput(model, library=str(tuned.library), inputs=inputs, resources=resources)
                prepared.notes[system] = tuned.note
            elif why := unavailable(system):
                prepared.failed[system] = f"skipped: {why}"
            elif not prof.source.has_module:
                prepared.failed[system] = f"{model} has no PyTorch module"
            elif system == TORCH_SPARSE and not hasattr(prof.source.module, "sparse_form"):
                prepared.failed[system] = f"{model} has no sparse form"
            elif system == TORCH_INT8 and not is_quantized(model):
                prepared.failed[system] = f"skipped: {model} is not quantized (its int8 row is {model}+int8's)"
            elif system in (EAGER_ROW, ZENTORCH, TORCH_SPARSE, TORCH_INT8):
                prepared.runs[system] = ModelInput(model, batch, seq_len, resources=resources,
                                                   runtime="" if system == EAGER_ROW else system)
            elif system == INDUCTOR:
                package = _exported(cache, folder, f"inductor-torch{_torch()}.pt2", f"{model}: torch.compile ahead of "
                                    "time (AOTInductor)", lambda path: inductor_package(prof.source, path))
                prepared.runs[system] = ModelInput(model, library=str(package), inputs=inputs, resources=resources,
                                                   runtime=INDUCTOR)
            elif system in (ONNXRUNTIME, OPENVINO):
                path = framework_onnx(system, prof.source, cache, folder)
                prepared.runs[system] = ModelInput(model, library=str(path), inputs=inputs, resources=resources,
                                                   runtime=system)
            else:
                prepared.failed[system] = f"unknown system; systems: {', '.join(SYSTEMS)}"
        except Exception as exc:  # noqa: BLE001 - a system that cannot be prepared is a row that says so
            log.warning("%s: %s could not be prepared: %s", model, system, exc)
            prepared.failed[system] = f"not prepared: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return prepared


def unavailable(system: str) -> str:
    """Why ``system`` cannot run on this host ("" where it can): its package missing, or for zentorch a CPU
    it does not optimise for (it runs elsewhere, as plain Inductor, which is not the row users would pick)."""
    package = {OPENVINO: "openvino", ZENTORCH: "zentorch"}.get(system)
    if package and importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install 'opbench[{package}]')"
    facts = host_facts()
    if system == ZENTORCH and not (facts.cpu_id.startswith("AuthenticAMD") and "avx512f" in facts.isa):
        return f"zentorch optimises only on AMD CPUs with AVX-512 (this host: {facts.cpu_model}, {facts.cpu_id})"
    return ""


def _exported(cache: TunedCache | None, folder: Path, name: str, doing: str, make: Callable[[Path], Path]) -> Path:
    """A framework's export: kept in and taken from ``cache`` when there is one, else made in ``folder``
    (``doing`` logged when it is made)."""
    def logged(path: Path) -> Path:
        log.info("%s", doing)
        return make(path)

    return cache.export(name, logged) if cache is not None else logged(folder / name)


def framework_onnx(system: str, source: ModelSource, cache: TunedCache | None, folder: Path) -> Path:
    """The ONNX file ``system`` runs: the model's export, which ONNX Runtime and OpenVINO share (a quantized
    model's quantized by ONNX Runtime's ``quantize_dynamic`` or ``quantize_static``, as its name asks), or for
    OpenVINO a quantized model quantized by NNCF, as OpenVINO's users quantize one."""
    from opbench.workloads.models.exports import onnx_file, openvino_int8_file

    if system == OPENVINO and is_quantized(source.name):
        return _exported(cache, folder, f"model-torch{_torch()}-nncf{metadata.version('nncf')}.onnx",
                         f"{source.name}: exporting to ONNX, quantized by NNCF for OpenVINO",
                         lambda path: openvino_int8_file(source, path))
    return _exported(cache, folder, f"model-torch{_torch()}.onnx", f"{source.name}: exporting to ONNX",
                     lambda path: onnx_file(source, path))


def _torch() -> str:
    return metadata.version("torch")
