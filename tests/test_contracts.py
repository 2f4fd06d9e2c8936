"""The shipped template, runner and store contracts (opbench.testing) run over OpBench's own."""
import copy

import pytest

from opbench.hardware.lock import HostLock
from opbench.measure.runner import LocalRunner
from opbench.space import get_template
from opbench.testing import runner_contract, store_contract, template_contract
from opbench.tracking import Recorder, read_jsonl_records, read_mlflow_records
from opbench.tracking.wal import WriteAheadLog
from opbench.workloads import parse_workload

CONTRACT_WORKLOADS = ["matmul:m=16,n=24,k=8", "dense:m=4,n=16,k=8,bias=1", "batch_matmul:b=2,m=8,n=8,k=8",
                      "conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,stride=1,pad=1",
                      "depthwise_conv2d:n=1,c=16,h=9,w=9,r=3,s=3,stride=2,pad=1", "softmax:m=4,n=33",
                      "dense:m=4,n=16,k=24,bias=1,dtype=int8"]


def _templates_of(workload):
    """Every CPU template with a space for ``workload``, by name."""
    from opbench.space import TEMPLATES

    for name in sorted(TEMPLATES):
        if name.startswith("cuda_") or name == "metaschedule":  # GPU only; a scheduled IR file, not a space
            continue
        try:
            yield name, get_template(workload, name)
        except Exception:  # noqa: BLE001 - a template for another op
            continue


def _templates():
    for spec in CONTRACT_WORKLOADS:
        workload = parse_workload(spec)
        for name, template in _templates_of(workload):
            yield pytest.param(template, workload, id=f"{name}-{spec}")


@pytest.mark.parametrize(("template", "workload"), list(_templates()))
def test_every_cpu_template_keeps_the_space_contract(template, workload):
    template_contract.check_space(template, workload, samples=5)


def test_a_model_operators_default_template_keeps_the_space_contract_and_leaves_its_shared_primfunc_as_it_was():
    """A model operator's PrimFunc is cached and shared by every schedule of it in the process (a catalogue
    workload's is made anew each time): on small-cnn@tiny's operators, every sampled config leaves it as it was."""
    import opbench.workloads.models  # noqa: F401 - registers the model operators
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.cache import extract

    for op in extract("small-cnn@tiny", 1, 128)[0]:
        workload = parse_workload(model_name("small-cnn@tiny", op.name, 1, 128))
        assert workload.prim_func().same_as(workload.prim_func())  # the one cached function
        template_contract.check_space(get_template(workload), workload, samples=3)


def test_the_build_contract_holds_for_a_tiled_and_a_packed_template(build_checker):
    for spec, name in (("matmul:m=16,n=24,k=8", "matmul"), ("conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,stride=1,pad=1", "conv2d_nchwc")):
        workload = parse_workload(spec)
        template_contract.check_builds_correct_kernels(build_checker, get_template(workload, name), workload, samples=2)


INT8_WORKLOADS = ["matmul:m=16,n=24,k=40,dtype=int8", "dense:m=4,n=16,k=24,bias=1,dtype=int8",
                  "batch_matmul:b=2,m=8,n=8,k=24,dtype=int8", "conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,stride=1,pad=1,dtype=int8"]
BF16_WORKLOADS = ["dense:m=4,n=16,k=24,bias=1,dtype=bfloat16", "conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,stride=1,pad=1,dtype=bfloat16"]


def _builds_with_every_cpu_template(build_checker, workload):
    names = [name for name, _ in _templates_of(workload)]
    assert names and (workload.op.name != "conv2d" or "conv2d_nchwc" in names)
    for _, template in _templates_of(workload):
        template_contract.check_builds_correct_kernels(build_checker, template, workload, samples=2)


@pytest.mark.parametrize("spec", INT8_WORKLOADS)
def test_int8_kernels_of_every_cpu_template_are_exact_on_full_range_inputs(build_checker, spec):
    workload = parse_workload(spec)
    inputs = workload.make_inputs()
    assert [a.dtype.name for a in inputs[:2]] == ["uint8", "int8"] and inputs[0].max() > 250 and inputs[1].min() < -120
    exact = workload.op.reference([a.astype("int64") for a in inputs], workload.params)  # numpy/torch in int64
    assert workload.reference(inputs).dtype.name == "int32" and (workload.reference(inputs) == exact).all()
    assert workload.tolerance() == (0.0, 0.0)  # the check compares exactly
    _builds_with_every_cpu_template(build_checker, workload)


@pytest.mark.parametrize("spec", BF16_WORKLOADS)
def test_bf16_kernels_of_every_cpu_template_accumulate_in_fp32(build_checker, spec):
    workload = parse_workload(spec)
    inputs = workload.make_inputs()
    assert [a.dtype.name for a in inputs[:2]] == ["bfloat16", "bfloat16"] and workload.output_dtype == "float32"
    assert len({float(v) for v in inputs[0].ravel()}) > 50  # drawn over [-1, 1), not just 0 and 1
    rounded = [a.astype("float32").astype("float64") for a in inputs]  # the same values, exactly
    assert abs(workload.reference(inputs) - workload.op.reference(rounded, workload.params)).max() < 1e-4
    _builds_with_every_cpu_template(build_checker, workload)


def test_a_template_that_breaks_the_contract_fails_it():
    workload = parse_workload("matmul:m=16,n=24,k=8")
    template = get_template(workload)

    lax = copy.copy(template)
    object.__setattr__(lax, "validate", lambda config, workload: dict(config))  # an unknown knob goes through
    with pytest.raises(AssertionError, match="accepted"):
        template_contract.check_space(lax, workload, samples=1)


def test_the_local_runner_keeps_the_runner_contract(tmp_path):
    good, broken = runner_contract.built_input(tmp_path), runner_contract.broken_input(tmp_path)
    runner_contract.check_runner(LocalRunner(lock=HostLock(tmp_path / "lock")), good, broken)


def test_our_stores_keep_the_store_contract(tracking_uri, tmp_path):
    log = tmp_path / "trials.jsonl"
    with Recorder("store-contract", tracking_uri, log) as recorder:
        store_contract.check_round_trip(recorder.mlflow.write, lambda: (recorder.mlflow.flush(), read_mlflow_records(
            ["store-contract"], tracking_uri))[1])
    from opbench.tracking.jsonl import JsonlWriter

    jsonl = JsonlWriter(tmp_path / "plain.jsonl")
    store_contract.check_round_trip(jsonl.write, lambda: read_jsonl_records(tmp_path / "plain.jsonl"))
    wal = WriteAheadLog(tmp_path / "wal")
    store_contract.check_round_trip(wal.append, lambda: [r for p in (tmp_path / "wal").glob("*.jsonl")
                                                         for r in read_jsonl_records(p)])


def test_a_store_that_loses_a_column_fails_the_contract():
    kept = []
    with pytest.raises(AssertionError, match="latencies_ms"):
        store_contract.check_round_trip(lambda row: kept.append({k: v for k, v in row.items() if k != "latencies_ms"}),
                                        lambda: kept)
