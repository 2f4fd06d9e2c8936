"""A model quantized to int8 (its name +int8, or --dtype int8): its matrix products by constant weights u8 x i8 into
i32, in agreement with the fp32 model, its int8 operators on the dot-product template, end to end in tune-model."""
import re

import numpy as np
import pytest

from opbench.hardware.targets import make_target
from opbench.record import Status

from .cli import ONE_PLACEMENT, run_cli


@pytest.mark.parametrize("n", [1, 16 * 3 + 5, 1 << 15, (1 << 15) + 8 * 16 + 3])  # tails; one chunk, then several
def test_dynamic_quantize_kernel_gives_numpys_scale_zero_point_and_values_exactly(n):
    import tvm

    from opbench.workloads.models.quantize import dynamic_quantize

    x = (np.random.default_rng(n).standard_normal(n) * 3 + 1).astype("float32")
    x[n // 2] = -7.5  # the range's low end away from the tail and the first chunk
    low, high = min(x.min(), 0), max(x.max(), 0)
    scale = np.float32(max((high - low) / np.float32(255), 1e-12))
    zero_point = np.round(-low / scale)
    expected = np.clip(np.round(x * (np.float32(1) / scale)) + zero_point, 0, 255).astype("uint8")
    kernel = tvm.compile(tvm.IRModule({"main": dynamic_quantize(n).with_attr("global_symbol", "main")}),
                         make_target("llvm", 2))
    args = [tvm.runtime.tensor(a) for a in (x, np.zeros(n, "uint8"), np.zeros((), "float32"), np.zeros((), "float32"))]
    kernel["main"](*args)
    assert args[2].numpy() == scale and args[3].numpy() == zero_point
    np.testing.assert_array_equal(args[1].numpy(), expected)


@pytest.mark.full  # imports and builds the model
def test_quantized_tiny_bert_agrees_with_the_fp32_model_and_only_its_weight_products_are_int8():
    from opbench.workloads.models.extract import import_model
    from opbench.workloads.models.sources import load_model

    source = load_model("bert-base@tiny+int8", seq_len=16)
    assert source.name == "bert-base@tiny+int8" and load_model("bert-base@tiny", seq_len=16).module is not None
    mod = import_model(source)
    products = [e for e in _calls(mod["main"]) if getattr(e.op, "name", "") == "relax.matmul"]
    int8 = [p for p in products if str(p.args[0].ty.dtype) == "uint8"]
    assert int8 and all(str(p.args[1].ty.dtype) == "int8" and str(p.ty.dtype) == "int32" for p in int8)
    assert len(int8) < len(products)  # attention's products of two activations stay fp32
    kernels = {gvar.name_hint for gvar in mod.functions if gvar.name_hint.startswith("dynamic_quantize")}
    assert kernels == {"dynamic_quantize", "dynamic_quantize1"}  # one per activation size, scheduled: no Relax min/max
    assert not [e for e in _calls(mod["main"]) if getattr(e.op, "name", "") in ("relax.min", "relax.max")]
    _agrees_with_fp32(mod, source)


@pytest.mark.full  # imports and builds the model
def test_a_quantized_cnns_convolutions_are_int8_padded_before_quantizing_and_agree_with_fp32():
    from opbench.workloads.models.extract import import_model
    from opbench.workloads.models.sources import load_model

    source = load_model("resnet-18@tiny+int8")
    mod = import_model(source)
    convs = [e for e in _calls(mod["main"]) if getattr(e.op, "name", "") == "relax.nn.conv2d"]
    assert convs and all((str(c.args[0].ty.dtype), str(c.args[1].ty.dtype), str(c.ty.dtype)) == ("uint8", "int8", "int32")
                         and [int(p) for p in c.attrs.padding] == [0, 0, 0, 0] for c in convs)  # padded in fp32 first
    assert min(int(c.args[1].ty.shape[1]) for c in convs) == 4  # the image's 3 channels, a fourth of zeros beside
    assert [e for e in _calls(mod["main"]) if getattr(e.op, "name", "") == "relax.nn.pad"]
    _agrees_with_fp32(mod, source)


@pytest.mark.full  # imports, calibrates and builds the model
def test_a_static_int8_cnn_is_calibrated_on_samples_and_quantizes_in_its_producers_epilogue():
    from opbench.workloads.models.calibrate import activation_ranges, samples, site
    from opbench.workloads.models.extract import fuse, import_model
    from opbench.workloads.models.quantize import quantize_products, rewrite_products
    from opbench.workloads.models.sources import load_model

    source = load_model("resnet-18@tiny+int8-static")
    fp32 = import_model(load_model("resnet-18@tiny"))
    drawn = samples(source.numpy_inputs())
    ranges = activation_ranges(fp32, rewrite_products, drawn)
    weights: list[np.ndarray] = []
    rewrite_products(fp32, lambda call, x, w: weights.append(w) or call)
    assert len(weights) >= 3 and set(ranges) == {site(w) for w in weights}  # every product observed
    images = np.stack([arrays[0] for arrays in drawn])  # the stem's activation is the image: its range, exactly
    stem = next(w for w in weights if w.shape[1] == 3)
    assert ranges[site(stem)] == pytest.approx((min(0.0, images.min()), max(0.0, images.max())))
    assert all(low <= 0.0 <= high and low < high for low, high in ranges.values())
    mod = quantize_products(fp32, ranges)  # what importing the +int8-static model makes
    convs = [e for e in _calls(mod["main"]) if getattr(e.op, "name", "") == "relax.nn.conv2d"]
    assert len(convs) == len(weights) and all(
        (str(c.args[0].ty.dtype), str(c.args[1].ty.dtype), str(c.ty.dtype)) == ("uint8", "int8", "int32") for c in convs)
    assert not [gv for gv in mod.functions if "dynamic_quantize" in gv.name_hint]  # constant scales: no range pass
    kernels = [gv.name_hint for gv in fuse(mod).functions]
    assert [k for k in kernels if k.startswith("fused_conv2d") and "round" in k and "clip" in k]  # fused quantize
    _agrees_with_fp32(mod, source)


def _agrees_with_fp32(mod, source):
    """The quantized module, built and run, agrees with the fp32 model's output (and differs from it: quantized)."""
    import tvm
    from tvm import relax

    from opbench.workloads.models.extract import fuse
    from opbench.workloads.models.quantize import AGREEMENT, cosine

    vm = relax.VirtualMachine(tvm.compile(fuse(mod), target=make_target("llvm", 1)), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.asarray(a)) for a in source.inputs])
    reference = source.reference()
    expected = np.asarray(reference[0] if isinstance(reference, (list, tuple)) else reference)
    got = (out[0] if not hasattr(out, "numpy") else out).numpy()
    assert cosine(got, expected) >= AGREEMENT and not np.allclose(got, expected, rtol=1e-6, atol=1e-6)  # quantized


def _calls(func):
    from tvm import relax

    calls = []
    relax.analysis.post_order_visit(func, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    return calls


@pytest.mark.full  # imports and builds the model
def test_a_quantized_models_int8_operators_take_the_dot_product_template_and_match_their_reference():
    import tvm

    import opbench.workloads.models  # noqa: F401 - registers where model operators come from
    from opbench.hardware.cpu_shape import current_shape
    from opbench.space import get_template
    from opbench.space.amx import AMX_FLAG
    from opbench.workloads import parse_workload
    from opbench.workloads.models.cache import imported
    from opbench.workloads.models.extract import fused_ops
    from opbench.workloads.models.sources import load_model

    ops, _ = fused_ops(imported(load_model("bert-base@tiny+int8", seq_len=16), 1, 16).mod)
    int8 = [op for op in ops if op.shapes and op.name.startswith("fused_matmul")]
    assert len(int8) == 3  # the attention's projections, the feed-forward's two
    names = set()
    for op in int8:
        workload = parse_workload(f"fused:model=bert-base@tiny+int8,func={op.name},seq_len=16")
        template = get_template(workload)
        names.add(template.name)
        assert workload.op.anchor_operands(workload.params)[:2] == ("uint8", "int8")
        config = template.default_config(workload)
        assert config["layout_transform"] == "weights_prepacked"  # a model's constant weight, packed once
        inputs = workload.make_inputs()
        expected = workload.reference(inputs)
        args = [tvm.runtime.tensor(a) for a in [*inputs, np.zeros_like(expected)]]
        tvm.compile(template.schedule(workload, config), target=make_target("llvm", 1))(*args)
        np.testing.assert_allclose(args[-1].numpy(), expected, *workload.tolerance())
    # AMX tiles where the CPU has them (16 tokens, whole tiles), else the dot-product instruction
    assert names == {"fused_matmul_amx_int8" if AMX_FLAG in current_shape().isa else "fused_matmul_int8"}


@pytest.mark.full  # imports the model, builds its convolutions
def test_a_quantized_cnns_convolutions_read_u8_and_i8_and_every_sampled_point_of_their_template_matches(build_checker):
    import opbench.workloads.models  # noqa: F401 - registers where model operators come from
    from opbench.hardware.cpu_shape import current_shape
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec
    from opbench.record import is_ok
    from opbench.space import get_template
    from opbench.space.dot_conv import LANES_FROM_COLUMNS
    from opbench.space.dot_product import instruction
    from opbench.testing import template_contract
    from opbench.workloads import parse_workload
    from opbench.workloads._base import INT8
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.cache import extract

    convs = [parse_workload(model_name("resnet-18@tiny+int8", op.name, 1, 128))
             for op in extract("resnet-18@tiny+int8", 1, 128)[0] if op.name.startswith("fused_conv2d")]
    assert len(convs) >= 3  # the stem (its 3 channels padded to 4), the blocks', the stride-2 shortcut's
    templates = set()
    for workload in convs:
        assert workload.op.anchor_operands(workload.params)[:2] == ("uint8", "int8")
        template = get_template(workload)
        templates.add(template.name)
        template_contract.check_builds_correct_kernels(build_checker, template, workload, samples=1)
    assert templates == ({"fused_conv2d_nchwc_int8"} if instruction(INT8, current_shape().isa) else {"fused_conv2d_nchwc"})
    if templates != {"fused_conv2d_nchwc_int8"}:
        return
    # where a residual is added as the output is written: by the accumulator's lanes in wide rows, else through a packed
    # output; any other written NCHW by a row's columns
    residual = [w for w in convs if re.search(r"_add\d*_add\d*", w.name)]  # batch norm's add, then the block's
    assert residual
    for workload in convs:
        config, width = get_template(workload).default_config(workload), workload.op.output_shape(workload.params)[-1]
        expected = ((0, "lanes") if width >= LANES_FROM_COLUMNS else (1, "columns")) if workload in residual else (0, "columns")
        assert (config["packed_output"], config["write_back"]) == expected, workload.name
    specs = [TrialSpec(w, {**get_template(w).default_config(w), "packed_output": 0, "write_back": "lanes"}, Resources(1),
                       "fused_conv2d_nchwc_int8") for w in residual]  # `columns` is the direct write-back as before
    failed = [(r["status"], r.get("error", "")[:300]) for r in build_checker.measure_batch(specs) if not is_ok(r)]
    assert not failed


def test_a_quantized_models_output_is_checked_for_agreement_not_equality_an_fp32_ones_at_its_scale():
    from opbench.measure.worker._common import check_output

    rng = np.random.default_rng(0)
    expected = rng.standard_normal(1000).astype("float32")
    close = expected + 0.05 * rng.standard_normal(1000).astype("float32")  # cosine ~0.999
    far = expected + 0.5 * rng.standard_normal(1000).astype("float32")  # cosine ~0.9
    assert check_output("bert-base+int8", close, expected)[1] is None
    wrong = check_output("bert-base+int8", far, expected)[1]
    assert wrong is not None and wrong.status is Status.WRONG_RESULT and "cosine similarity 0.8" in wrong.error
    assert check_output("bert-base", close, expected)[1] is not None  # fp32: within 1e-3 or wrong
    # an output of vanishing magnitude (a random MobileNetV2's, ~1e-27) is compared at its own scale
    assert check_output("mobilenet-v2", expected * 1e-27, expected * 1e-27 * (1 + 1e-5))[1] is None
    assert check_output("mobilenet-v2", close * 1e-27, expected * 1e-27)[1] is not None


def test_an_unknown_model_dtype_exits_2_naming_the_choices(capsys):
    from opbench.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tune-model", "bert-base@tiny", "--dtype", "int4"])
    assert exit_.value.code == 2 and "invalid choice: 'int4' (choose from 'float32', 'int8', 'int8-static')" in capsys.readouterr().err


def test_tune_model_dtype_int8_tunes_and_verifies_the_quantized_model(tmp_path, tracking_uri):
    out = run_cli("tune-model", "lstm@tiny", "--dtype", "int8", "--trials-per-op", "2", "--max-ops", "1", *ONE_PLACEMENT,
                  "--verify-rounds", "0", "--tracking-uri", tracking_uri, "--study", "q8",
                  "--storage", f"sqlite:///{tmp_path / 'optuna.db'}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lstm@tiny+int8, batch 1" in out.stdout and "tuned model output matches the reference" in out.stdout
    from opbench.tracking import read_mlflow_records

    records = read_mlflow_records(["q8"], tracking_uri)
    assert not [r for r in records if r["status"] != "ok"], [r.get("error", "")[:200] for r in records if r["status"] != "ok"]
    trials = {}
    for record in records:
        trials.setdefault(record["workload"], []).append(record["template"])
    (tuned,) = [w for w, templates in trials.items() if len(templates) == 3]  # the largest: its default, 2 trials
    assert len(set(trials[tuned])) == 1  # of one template (which operator is largest is the host's to say)
    products = [w for w in trials if "/fused_matmul" in w]
    assert any(set(trials[w]) == {"fused_matmul_int8"} for w in products)  # the int8 products on the dot-product template


@pytest.mark.full  # imports and builds the model
def test_a_quantized_models_onnx_runtime_row_runs_onnx_runtimes_own_dynamic_quantization(tmp_path):
    import onnx
    import onnxruntime as ort

    from opbench.workloads.models.exports import onnx_file
    from opbench.workloads.models.quantize import AGREEMENT, cosine
    from opbench.workloads.models.sources import load_model

    source = load_model("bert-base@tiny+int8", seq_len=16)
    path = onnx_file(source, tmp_path / "model.onnx")
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops  # quantized as ONNX Runtime's users do
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]  # the fp32 export it was made from not left behind
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), source.inputs)})[0]
    expected = source.reference()
    assert cosine(got, expected[0] if isinstance(expected, (list, tuple)) else expected) >= AGREEMENT
