"""The frameworks a whole model is compared with run it as they would for a user, in processes that never
import TVM, and give eager's output: torch.compile (an AOTInductor package), ONNX Runtime and OpenVINO (an ONNX
file), zentorch where it is installed; one that cannot run on this host says why. (The tune-model test in
test_models.py prepares systems through ``--compare``.)"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from opbench.hardware.resources import Resources
from opbench.measure.models import save_inputs
from opbench.measure.protocol import EAGER, INDUCTOR, ONNXRUNTIME, OPENVINO, TORCH_SPARSE, ZENTORCH, ModelInput
from opbench.record import Status
from opbench.workloads.models.exports import inductor_package, onnx_file
from opbench.workloads.models.sources import load_model

pytestmark = pytest.mark.full
MODEL = "simple:dense:m=8,n=16,k=32"  # a one-layer torch model: quick to compile ahead of time


@pytest.fixture(scope="module")
def measurer(tmp_path_factory):
    """The suite's measurer with the product's run timeout: a framework's first call builds the model (OpenVINO
    compiles the ONNX file, zentorch the module), which took over the suite's 10 s on a busy 2-core host."""
    from opbench import settings
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions

    options = MeasureOptions(TimingPolicy(repeat=3, min_repeat_ms=5.0), run_timeout_s=settings.RUN_TIMEOUT_S,
                             lock_path=tmp_path_factory.mktemp("lock") / "timing.lock")
    with Measurer(options) as m:
        yield m


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frameworks")
    source = load_model(MODEL)
    reference = source.reference()[0]
    return {"inputs": save_inputs(source.numpy_inputs(), folder / "inputs.npz", reference),
            "wrong": save_inputs(source.numpy_inputs(), folder / "wrong.npz", reference + 1.0),
            INDUCTOR: inductor_package(source, folder / "model.pt2"), ONNXRUNTIME: onnx_file(source, folder / "model.onnx"),
            OPENVINO: folder / "model.onnx"}


@pytest.mark.xdist_group("framework-artifacts")  # one worker compiles the AOTInductor package (~30 s) once
def test_each_framework_gives_eagers_output_in_a_process_without_tvm(measurer, artifacts):
    runs = [ModelInput(MODEL, library=str(artifacts[system]), inputs=str(artifacts["inputs"]), runtime=system,
                       resources=Resources(2)) for system in (INDUCTOR, ONNXRUNTIME, OPENVINO)]
    runs.append(ModelInput(MODEL, resources=Resources(2)))
    results = measurer.time_models_fresh(runs)
    for run, result in zip(runs, results):
        assert result.status is Status.OK, (run.system, result.error)
        assert result.latencies_s and all(t > 0 for t in result.latencies_s)
        if run.system == EAGER:
            assert math.isnan(result.max_abs_err)  # eager is the reference
        else:
            assert result.max_abs_err < 1e-4, run.system
    assert len({r.pid for r in results}) == len(runs)  # each in a fresh process


@pytest.mark.xdist_group("framework-artifacts")
def test_a_framework_whose_output_differs_is_a_wrong_result(measurer, artifacts):
    for system in (INDUCTOR, ONNXRUNTIME, OPENVINO):
        result = measurer.time_model(ModelInput(MODEL, library=str(artifacts[system]), inputs=str(artifacts["wrong"]),
                                                runtime=system))
        assert result.status is Status.WRONG_RESULT and np.isclose(result.max_abs_err, 1.0, atol=1e-3), system


def test_the_gcns_sparse_form_gives_eagers_output_and_a_model_without_one_says_so(measurer):
    import torch

    dense = load_model("gcn@tiny", batch=2)
    with torch.no_grad():  # two graphs side by side in one sparse product: each graph's own output
        np.testing.assert_allclose(dense.module.sparse_form()(*dense.inputs).numpy(), dense.reference()[0], atol=1e-5)
    sparse, missing = (measurer.time_model(ModelInput(model, resources=Resources(2), runtime=TORCH_SPARSE))
                       for model in ("gcn@tiny", MODEL))
    assert sparse.status is Status.OK and sparse.max_abs_err < 1e-4, sparse.error  # checked against eager
    assert missing.status is not Status.OK and f"{MODEL} has no sparse form" in missing.error


def test_zentorch_compiles_the_module_and_gives_eagers_output(measurer):
    pytest.importorskip("zentorch", reason="zentorch is an optional extra: pip install 'opbench[zentorch]'")
    result = measurer.time_model(ModelInput(MODEL, resources=Resources(2), runtime=ZENTORCH))
    assert result.status is Status.OK and result.max_abs_err < 1e-4, result.error  # checked against eager


def test_pytorchs_dynamic_quantization_of_a_quantized_model_agrees_with_eager(measurer):
    from opbench.measure.protocol import TORCH_INT8

    quantized, unmarked = (measurer.time_model(ModelInput(model, seq_len=16, resources=Resources(2), runtime=TORCH_INT8))
                           for model in ("bert-base@tiny+int8", "bert-base@tiny"))
    assert quantized.status is Status.OK and quantized.max_abs_err > 0, quantized.error  # int8, in agreement with eager
    assert unmarked.status is Status.WRONG_RESULT and "cosine" not in unmarked.error  # an fp32 model's check: 1e-3


def test_a_framework_this_host_cannot_run_is_skipped_saying_why(monkeypatch):
    from opbench.hardware.resources import host_facts
    from opbench.studies.models import systems

    facts = host_facts()
    epyc = dataclasses.replace(facts, cpu_id="AuthenticAMD/26.17.0", isa=(*facts.isa, "avx512f"))
    xeon = dataclasses.replace(facts, cpu_id="GenuineIntel/6.143.8", isa=(*facts.isa, "avx512f"))
    installed = {"openvino", "zentorch"}
    monkeypatch.setattr(systems.importlib.util, "find_spec", lambda name: object() if name in installed else None)
    for host, zentorch in ((epyc, ""), (xeon, "zentorch optimises only on AMD CPUs with AVX-512 (this host:")):
        monkeypatch.setattr(systems, "host_facts", lambda host=host: host)
        assert systems.unavailable(ZENTORCH).startswith(zentorch) and systems.unavailable(OPENVINO) == ""
    installed.clear()
    assert systems.unavailable(OPENVINO) == "openvino is not installed (pip install 'opbench[openvino]')"
    assert systems.unavailable(ZENTORCH) == "zentorch is not installed (pip install 'opbench[zentorch]')"
    assert systems.unavailable(ONNXRUNTIME) == ""  # a dependency of OpBench itself


def test_metaschedule_at_a_trial_budget_tunes_the_model_and_says_what_it_left_untuned(measurer, tmp_path):
    from opbench.hardware.targets import make_target
    from opbench.studies.models.metaschedule import metaschedule_model
    from opbench.workloads.models.extract import fuse, import_model

    source = load_model(MODEL)
    inputs = save_inputs(source.numpy_inputs(), tmp_path / "inputs.npz", source.reference()[0])
    built = metaschedule_model(fuse(import_model(source)), make_target("llvm", 1), tmp_path, trials=4)
    assert (built.trials, built.tasks, built.untuned_tasks) == (4, 1, 0)  # the dense is the model's one task
    assert built.note == "4 trials, 4 a task's round; 0 of 1 tasks untuned"
    run = measurer.time_model(ModelInput(MODEL, library=str(built.library), inputs=str(inputs)))
    assert run.status is Status.OK and run.max_abs_err < 1e-4  # MetaSchedule's schedule gives eager's output



def test_a_profile_builds_and_times_tvms_default_lowering_only_when_asked(measurer, tmp_path):
    from opbench.hardware.targets import make_target
    from opbench.studies.models.profile import UNTUNED, profile_model

    source = load_model(MODEL)
    prof = profile_model(source, make_target("llvm", 1), measurer, tmp_path, 1, 1, 128, untuned=False)
    assert prof.untuned_library is None and math.isnan(prof.model_ms) and not (tmp_path / UNTUNED).exists()
    assert prof.ops and all(op.latency_ms > 0 for op in prof.ops)  # its operators are timed all the same
    assert prof.torch_ms > 0 and (tmp_path / "inputs.npz").exists()  # eager, and the reference the others match
    # (built and timed when asked: the tune-model and model-ops tests' profiles)


def test_whole_models_are_timed_warm_in_every_system_by_a_measurer_that_times_operators_cold(measurer, monkeypatch):
    """tune-model times operators cold (as inside a model); the whole models it compares are all timed warm, run
    after run: a framework's caches are not flushed before each of its runs while TVM's build runs back to back."""
    cold = dataclasses.replace(measurer.options, timing=dataclasses.replace(measurer.timing, cache_flush=True))
    monkeypatch.setattr(measurer, "options", cold)
    assert measurer.timing.cache_state == "cold" and measurer.timing.of_models().cache_state == "warm"
    result = measurer.time_model(ModelInput(MODEL, resources=Resources(1)))
    assert result.status is Status.OK and result.number > 1  # calls a repeat sized warm (a cold series takes one)


def test_a_quantized_models_openvino_row_is_nncfs_static_int8_and_agrees_with_fp32_in_a_fresh_process(measurer, tmp_path):
    """OpenVINO's users quantize with NNCF (static, calibrated), not ONNX Runtime's quantize_dynamic: the OpenVINO
    row of a +int8 model runs NNCF's QuantizeLinear/DequantizeLinear file, ONNX Runtime's row its own dynamic one
    (a +int8-static model's: quantize_static's QDQ file), and the worker holds OpenVINO's int8 output to agreement
    with the fp32 model's."""
    import onnx

    from opbench.studies.models.systems import framework_onnx

    source = load_model("resnet-18@tiny+int8")
    openvino, onnxruntime = (framework_onnx(system, source, None, tmp_path) for system in (OPENVINO, ONNXRUNTIME))
    assert "nncf" in openvino.name and openvino != onnxruntime
    ops = {system: {node.op_type for node in onnx.load(str(path)).graph.node}
           for system, path in ((OPENVINO, openvino), (ONNXRUNTIME, onnxruntime))}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops[OPENVINO] and "ConvInteger" not in ops[OPENVINO]
    assert "DynamicQuantizeLinear" in ops[ONNXRUNTIME] and "QuantizeLinear" not in ops[ONNXRUNTIME]
    assert not list(tmp_path.glob("*-fp32.onnx"))  # the fp32 exports they were made from not left behind
    static = framework_onnx(ONNXRUNTIME, load_model("resnet-18@tiny+int8-static"), None, tmp_path / "static")
    ops = {node.op_type for node in onnx.load(str(static)).graph.node}  # ONNX Runtime's quantize_static: QDQ
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops and "DynamicQuantizeLinear" not in ops
    inputs = save_inputs(source.numpy_inputs(), tmp_path / "inputs.npz", source.reference()[0])
    result = measurer.time_model(ModelInput(source.name, library=str(openvino), inputs=str(inputs), runtime=OPENVINO,
                                            resources=Resources(2)))
    assert result.status is Status.OK, result.error
    wrong = save_inputs(source.numpy_inputs(), tmp_path / "wrong.npz", -source.reference()[0])
    result = measurer.time_model(ModelInput(source.name, library=str(openvino), inputs=str(wrong), runtime=OPENVINO))
    assert result.status is Status.WRONG_RESULT and "cosine similarity" in result.error
