"""Models: sources, operator extraction with time shares, and bad input."""
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import mlflow
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources
from opbench.record import TrialRecord
from opbench.tracking import read_mlflow
from opbench.workloads.models.extract import anchor_kind
from opbench.workloads.models.sources import load_model, model_names

from .cli import ONE_PLACEMENT, run_cli


def make_onnx(path, rows=(16,)):
    """A small MLP as an ONNX file written with onnx's helpers: MatMul + Add + Relu, then MatMul, on inputs of
    ``rows`` x 64 (a name is a dynamic dimension)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n)
               for n, s in (("W1", (64, 128)), ("B1", (128,)), ("W2", (128, 16)))]
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["Y"]), helper.make_node("Add", ["Y", "B1"], ["Z"]),
             helper.make_node("Relu", ["Z"], ["H"]), helper.make_node("MatMul", ["H", "W2"], ["O"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [*rows, 64])],
                              [helper.make_tensor_value_info("O", TensorProto.FLOAT, [*rows, 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _model_ops(model, tracking_uri, study, *options):
    return run_cli("model-ops", model, *ONE_PLACEMENT, "--tracking-uri", tracking_uri, "--study", study, *options)


# bert-base@tiny: the tune-model test extracts it; lstm@tiny's anchors (matmul, elementwise) are the ONNX MLP's
@pytest.mark.parametrize("model", ["small-cnn@tiny", "onnx"])
def test_model_ops_extracts_fused_operators_whose_shares_add_up(model, tmp_path, tracking_uri):
    name = str(make_onnx(tmp_path / "mlp.onnx")) if model == "onnx" else model
    out = _model_ops(name, tracking_uri, "mo")
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"output matches (torch|ONNX's reference evaluator) \(max \|err\|", out.stdout)
    ops_ms, model_ms = map(float, re.search(r"sum of operators ([\d.]+) ms; whole model on the Relax VM ([\d.]+) ms",
                                            out.stdout).groups())
    assert ops_ms > 0 and model_ms > 0  # how close they are is a timing, measured in benchmarks, not asserted
    frame = read_mlflow(["mo"], tracking_uri)
    assert frame["share"].sum() == pytest.approx(1.0)
    assert (frame["latency_ms"] > 0).all() and (frame["calls"] >= 1).all()
    key = frame[frame["key_op"] == "True"]
    assert key["share"].sum() >= 0.9 > key["share"].sum() - key["share"].min()  # the fewest covering 90%
    assert (frame.loc[frame["op"].isin(["matmul", "conv2d", "dense", "batch_matmul"]), "flops"] > 0).all()
    anchor = {"small-cnn@tiny": "conv2d", "onnx": "matmul"}
    assert anchor[model] in set(key["op"])  # the model's heavy operator is a key one
    # each operator's memory, and the model's as planned
    assert (frame["mem.input"] > 0).all() and (frame["mem.output"] > 0).all() and (frame["mem.workspace"] >= 0).all()
    assert "workspace KB" in out.stdout
    weights, activations, largest = map(float, re.search(r"planned memory: weights ([\d.e+-]+) MB, activations ([\d.e+-]+) MB "
                                                         r"after Relax's memory planning, largest operator workspace "
                                                         r"([\d.e+-]+) KB", out.stdout).groups())
    assert weights > 0 and activations > 0 and largest * 1024 == pytest.approx(frame["mem.workspace"].max(), rel=1e-3)
    # profiled with each operator's template default (the heavy ones have one: they are what gets tuned)
    assert set(frame.loc[frame["op"] == anchor[model], "template"]) == {"default"}
    plot = re.search(r"time against memory per operator: (\S+) ", out.stdout).group(1)
    assert Path(plot).stat().st_size > 0


def test_model_sources_and_their_errors(tmp_path):
    assert {"bert-base", "bert-base@tiny", "lstm", "gru@tiny", "small-cnn", "convnext-tiny@tiny"} <= set(model_names())
    source = load_model("gru@tiny", batch=2)
    assert source.kind == "torch" and source.inputs[0].shape[0] == 2
    with pytest.raises(OpBenchError, match="unknown model 'nope'"):
        load_model("nope")
    with pytest.raises(OpBenchError, match="ONNX file not found"):
        load_model(str(tmp_path / "missing.onnx"))
    (tmp_path / "bad.onnx").write_text("not a model")
    with pytest.raises(OpBenchError, match="not a readable ONNX model"):
        load_model(str(tmp_path / "bad.onnx"))
    assert anchor_kind("fused_conv2d1_add1_relu1") == "conv2d" and anchor_kind("max_pool2d") == "pool"
    assert anchor_kind("fused_matmul_add2") == "matmul"


def test_a_models_import_is_cached_for_the_next_process_with_the_weights_it_was_checked_with(tmp_path, monkeypatch):
    import tvm

    from opbench.workloads.models import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    first, second = load_model("small-cnn@tiny"), load_model("small-cnn@tiny")
    for a, b in zip(first.module.state_dict().values(), second.module.state_dict().values()):
        assert (a == b).all()  # a model's name means one set of weights: its build is seeded
    del second._built  # as a new process would have it: nothing built yet
    made = cache.imported(first, 1, 8)
    kept = cache.imported(second, 1, 8)
    assert "_built" not in vars(second)  # read from the cache: the model was not built again
    tvm.ir.assert_structural_equal(kept.mod, made.mod, map_free_vars=True)
    np.testing.assert_array_equal(kept.reference, made.reference)
    assert all((a == b).all() for a, b in zip(kept.inputs, made.inputs)) and len(kept.inputs) == len(first.inputs)
    (entry,) = tmp_path.glob("*/fused.json")
    entry.write_text("{cut short")  # an entry that cannot be read is made again
    assert "_built" not in vars(second) and cache.imported(second, 1, 8).reference.shape == made.reference.shape
    assert "_built" in vars(second)
    import onnx

    path = make_onnx(tmp_path / "mlp.onnx")
    cache.imported(load_model(str(path)), 1, 128)
    edited = onnx.load(str(path))
    edited.graph.doc_string = "the same file, edited"
    onnx.save(edited, str(path))
    cache.imported(load_model(str(path)), 1, 128)
    assert len(list(tmp_path.glob("*mlp.onnx-*/fused.json"))) == 2  # keyed by the file's content, not its name


def test_a_model_the_frontend_cannot_convert_is_named(tmp_path, tracking_uri):
    import onnx
    from onnx import TensorProto, helper

    path = tmp_path / "mystery.onnx"  # an operator of a domain no frontend knows
    graph = helper.make_graph([helper.make_node("Mystery", ["X"], ["Y"], domain="com.example")], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]),
              str(path))
    out = run_cli("model-ops", str(path), "--tracking-uri", tracking_uri, "--study", "mo")  # fails before measuring
    assert out.returncode == 2 and f"{path}: Relax's ONNX frontend cannot import it" in out.stderr and "Mystery" in out.stderr


def test_tune_model_tunes_key_operators_and_builds_the_model_with_them(tmp_path, tracking_uri):
    tune = ["tune-model", "bert-base@tiny", "--trials-per-op", "2", "--max-ops", "1", *ONE_PLACEMENT,
            "--tracking-uri", tracking_uri, "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--reuse", str(tmp_path / "kept")]
    out = run_cli(*tune, "--verify-rounds", "0", "--study", "tm")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tuned model output matches the reference" in out.stdout
    tuned_stdout = out.stdout
    frame = read_mlflow(["tm"], tracking_uri)
    counts = frame["workload"].value_counts()
    tuned = counts[counts == 3].index  # the default, then 2 trials, for the largest key operator ...
    assert len(tuned) == 1
    assert len(counts) > 10 and (counts[counts != 3] == 1).all()  # ... the default alone for the rest
    lines = out.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("operator "))) + 2
    shares = {line.split()[0]: float(line.split()[2]) for line in lines[first:first + len(counts)]}
    assert len(shares) == len(counts)  # a row per operator, whichever schedule it was built with
    assert tuned[0].split("/")[1] == max(shares, key=shares.get)  # ranked by the time after the defaults
    assert set(frame["source_model"]) == {"bert-base@tiny"}
    # every operator builds, runs and matches, the embedding's integer take and cast among them
    assert not frame["status"].isin(["build_error", "run_error", "wrong_result"]).any(), frame["error"].dropna().tolist()
    assert {"model:bert-base@tiny/take", "model:bert-base@tiny/fused_cast_reshape"} <= set(frame["workload"])
    records = (tmp_path / "tune-model" / "tm" / "database_tuning_record.json").read_text().splitlines()
    assert 1 <= len(records) <= len(counts)  # one MetaSchedule record per operator made faster
    systems = {"tuned", "untuned", "torch"}
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.split()[:1] and line.split()[0] in systems}
    assert set(rows) == systems  # verified in fresh processes by the bucket test below
    client = mlflow.tracking.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("tm")
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`opbench.kind` = 'study'")[0].data
    assert parent.metrics["trials"] == len(frame)  # what MetaSchedule gets at equal trials: every candidate timed
    assert parent.metrics["prepacked_ops"] >= 1  # the Linear layers' matmuls take their weights packed at build time
    # model-ops profiles the model with the schedules the tuned build used: each one its database holds
    out = _model_ops("bert-base@tiny", tracking_uri, "mo-tuned", "--schedules", str(tmp_path / "tune-model" / "tm"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"the tuned schedules of {tmp_path / 'tune-model' / 'tm'}" in out.stdout
    ops = read_mlflow(["mo-tuned"], tracking_uri)
    assert (ops["template"] == "tuned").sum() == len(records) and ops["share"].sum() == pytest.approx(1.0)
    assert (ops.loc[ops["template"] == "tuned", "mem.prepacked"] > 0).any()  # a Linear's weight, packed at build time
    # --reuse: a second run with the same key builds the model from the records the first kept, measuring none
    again = run_cli(*tune, "--verify-rounds", "0", "--compare", "torch", "--study", "tm-again")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"tuning reused from {tmp_path / 'kept'}" in again.stdout and "tuned model output matches" in again.stdout
    # a schedule tuned in both runs is as fast as its kept record (which operators keep theirs is decided inside the
    # model, timed again in each run: a timing, not asserted)
    first, second = _tuned(tuned_stdout), _tuned(again.stdout)
    assert {op: second[op] for op in first.keys() & second.keys()} == {op: first[op] for op in first.keys() & second.keys()}
    untuned = {row[0]: row[3] for row in _operator_rows(tuned_stdout)}
    assert {row[0]: row[3] for row in _operator_rows(again.stdout)} == untuned  # the kept profile: none timed again
    assert "operator profile of" in again.stdout
    assert "tuning reused" not in tuned_stdout and len(read_mlflow(["tm-again"], tracking_uri)) == 0


def _operator_rows(stdout: str) -> list[list[str]]:
    """tune-model's table of operators: name, kind, share, untuned ms, built-with ms, speed-up, how."""
    lines = stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("operator "))) + 2
    return [line.split() for line in lines[first:lines.index("", first)]]


def _tuned(stdout: str) -> dict[str, str]:
    """tune-model's tuned operators and their tuned ms."""
    return {row[0]: row[4] for row in _operator_rows(stdout) if row[-1] == "tuned"}


def test_a_catalogue_workload_is_a_model_too(tracking_uri):
    out = _model_ops("simple:matmul:m=64,n=64,k=64", tracking_uri, "mo", "--schedules", "untuned")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "output matches torch" in out.stdout and "tune it: opbench tune 'matmul:m=64,n=64,k=64'" in out.stdout
    assert set(read_mlflow(["mo"], tracking_uri)["template"]) == {"untuned"}  # TVM's default lowering, as asked


def test_model_ops_names_schedules_it_cannot_use(tmp_path):
    out = run_cli("model-ops", "small-cnn@tiny", "--schedules", str(tmp_path))
    assert out.returncode == 2 and "is neither untuned, defaults nor a MetaSchedule database folder" in out.stderr


@pytest.mark.slow
def test_every_fused_point_builds_a_correct_kernel(build_checker):
    """Each model operator's default template (packed on a plain convolution, tiled on a matmul, the
    fused one elsewhere): a weighted sample of its space, each checked against the operator's
    unscheduled build."""
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec
    from opbench.space import get_template
    from opbench.workloads import parse_workload
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.cache import extract

    from .test_space import BUILT_PER_KIND, weighted_configs

    ops = extract("small-cnn", 1, 128)[0]
    workloads = [parse_workload(model_name("small-cnn", op.name, 1, 128)) for op in ops]
    templates = {w.name: get_template(w) for w in workloads}
    assert {t.name for t in templates.values()} == {"fused", "fused_conv2d_nchwc", "fused_depthwise_conv2d_nchwc",
                                                    "fused_matmul"}
    specs = [TrialSpec(w, config, Resources(1 + i % 2), templates[w.name].name) for w in workloads
             for i, config in enumerate(weighted_configs(w, BUILT_PER_KIND // 4 // len(workloads),
                                                         ("inline", "vectorize", "parallel", "packed_output", "cache_write"),
                                                         template=templates[w.name]))]
    records = build_checker.measure_batch(specs)
    assert {r["status"] for r in records} == {"ok"}, [(r["workload"], r["error"]) for r in records if r["status"] != "ok"][:3]
    packing = {(r["template"], r.get("knob.layout_transform")) for r in records if r["template"] != "fused"}
    assert {layout for _, layout in packing} == {"weights_prepacked"}  # timed as the model runs them: weights packed


def _model_workloads(model, kinds):
    """The fused operators of ``model`` (batch 1, 128 tokens) of these kinds, and their workloads."""
    from opbench.workloads import parse_workload
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.cache import extract

    ops = [op for op in extract(model, 1, 128)[0] if op.kind in kinds]
    return ops, [parse_workload(model_name(model, op.name, 1, 128)) for op in ops]


def _every_sampled_point_is_correct(build_checker, workloads, per_workload):
    """``per_workload`` configs of each workload's default template, each built and checked against its reference."""
    from opbench.hardware.resources import Resources
    from opbench.measure.types import TrialSpec
    from opbench.space import get_template

    from .test_space import weighted_configs

    specs = [TrialSpec(w, config, Resources(1 + i % 2), get_template(w).name) for w in workloads
             for i, config in enumerate(weighted_configs(w, per_workload, ("pad_at", "padding", "cache_write", "order"),
                                                         template=get_template(w)))]
    records = build_checker.measure_batch(specs)
    assert {r["status"] for r in records} == {"ok"}, [(r["workload"], r["error"]) for r in records if r["status"] != "ok"][:3]


@pytest.mark.slow
def test_a_models_transposed_convolutions_are_imported_as_convolutions_whose_every_point_builds(build_checker):
    """DCGAN's generator in its sub-pixel form: the latent vector's transposed convolution a matmul, each strided
    one four convolutions over the input (one a phase, each giving its own quarter of the output) or, where a phase
    has too few output channels to fill a vector, one (the phases along its output channels, on a grid a row and a
    column larger), on the convolution template, every sampled point checked against the operator's unscheduled
    build."""
    from opbench.space import get_template
    from opbench.workloads.models.cache import extract

    assert not any("conv2d_transpose" in op.name for op in extract("dcgan@tiny", 1, 128)[0])
    anchors, workloads = _model_workloads("dcgan@tiny", ("conv2d", "matmul"))
    strided = [op for op in anchors if op.kind == "conv2d"]  # 4x4 kernels of stride 2: four phases of 2x2 taps each
    assert [op.kind for op in anchors].count("matmul") == 1 and len(strided) == 4 + 4 + 1 + 1  # 32, 16, 8, 3 channels
    assert all(op.shapes[1][2:] == (2, 2) for op in strided)
    own = [op for op in strided if op.shapes[0][2:] == op.shapes[-1][2:]]
    stacked = [op for op in strided if op.shapes[-1][2:] == tuple(size + 1 for size in op.shapes[0][2:])]
    assert len(own) == 8 and len(stacked) == 2 and all(op.shapes[-1][1] % 4 == 0 for op in stacked)
    assert {get_template(w).name for w in workloads} == {"fused_conv2d_nchwc", "fused_matmul"}
    _every_sampled_point_is_correct(build_checker, workloads, 2)  # 11 operators: 2 points each


@pytest.mark.slow
@pytest.mark.full  # two models imported, their poolings built
def test_a_models_pooling_windows_take_their_padding_as_planes_and_every_point_builds(build_checker):
    """A padded average pooling of stride 1 (Inception-v3's, its division by the taps inside the image) offers its
    padding as each channel's plane, by default; an unpadded one (Inception-v3's max poolings) and a ceil-mode
    one whose windows never reach its padding (SqueezeNet's) does not; padded or a vector wide, each is scalar by
    default; every sampled point of each is correct."""
    from opbench.hardware.cpu_shape import current_shape
    from opbench.space import get_template

    windows = {}
    for model in ("inception-v3@tiny", "squeezenet1.1@tiny"):
        _, workloads = _model_workloads(model, ("pool",))
        windows[model] = {w.op.pool_window(w.params) for w in workloads}
        for w in workloads:
            template = get_template(w)
            default = template.default_config(w)
            padded, row = w.op.pool_window(w.params) == "padded", w.op.output_shape(w.params)[-1]
            scalar = padded or row >= current_shape().fp32_lanes  # else a vector of the row's width
            assert template.name == "fused" and default["vectorize"] == (0 if scalar else 1)
            assert default["j_inner"] == 1 or not scalar
            assert default.get("padding") == ("plane" if padded else None)
        _every_sampled_point_is_correct(build_checker, workloads, 2)  # a padded one: its padding each way
    assert windows == {"inception-v3@tiny": {"padded", "plain"}, "squeezenet1.1@tiny": {"plain"}}


def _conv_onnx(path, channels, inputs=16, size=6, window=1, stride=1):
    """A ``window`` x ``window`` convolution of (1, ``inputs``, ``size``, ``size``) to ``channels`` by ``stride``,
    unpadded, with a bias, then ReLU, as an ONNX file (by default a 1x1 one of (1, 16, 6, 6))."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n)
               for n, s in (("W", (channels, inputs, window, window)), ("B", (channels,)))]
    out = (size - window) // stride + 1
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["Y"], strides=[stride, stride]),
             helper.make_node("Relu", ["Y"], ["O"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, inputs, size, size])],
                              [helper.make_tensor_value_info("O", TensorProto.FLOAT, [1, channels, out, out])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.slow
def test_a_convolution_of_padded_output_channels_writes_only_its_own(tmp_path, build_checker):
    """255 output channels computed as 256 and cropped: the packed template's tile writes the padded channels to its
    own buffer and the crop, bias and ReLU run after it over the output's 255 (a write-back of 256 into the output,
    TVM's reverse_compute_inline of the crop, writes past it: the workers' memory is corrupted and they hang), and
    every sampled point is correct."""
    from tvm import s_tir

    from opbench.space import get_template

    ops, (w,) = _model_workloads(str(_conv_onnx(tmp_path / "conv.onnx", 255)), ("conv2d",))
    template = get_template(w)
    assert "strided_slice" in ops[0].name and ops[0].shapes[1][0] == 256 and template.name == "fused_conv2d_nchwc"
    for config in (template.default_config(w), {**template.default_config(w), "packed_output": 1}):
        sch = s_tir.Schedule(template.schedule(w, config))
        root = sch.get(sch.get_sblock("root"))
        blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
        writers = [b for b in blocks if not any(b.writes[0].source.same_as(a) for a in root.alloc_buffers)]
        assert [[int(iv.dom.extent) for iv in b.iter_vars] for b in writers] == [list(w.op.output_shape(w.params))]
    _every_sampled_point_is_correct(build_checker, [w], 4)


@pytest.mark.slow
def test_a_stems_odd_output_width_is_computed_in_whole_vectors_on_columns_and_every_point_builds(tmp_path, build_checker):
    """A 3x3 stride-2 stem of 3 channels whose output rows are 15 columns (SqueezeNet's 111): computed 16 wide, the
    input padded on its right, and cropped; its rows whole vectors, its default the column schedule, and every sampled
    point correct (the crop, bias and ReLU after the tiles)."""
    from opbench.space import get_template

    ops, (w,) = _model_workloads(str(_conv_onnx(tmp_path / "stem.onnx", 16, inputs=3, size=31, window=3, stride=2)),
                                 ("conv2d",))
    template = get_template(w)
    assert "strided_slice" in ops[0].name and w.op.output_shape(w.params)[-1] == 15
    assert template.default_config(w)["algorithm"] == "columns"
    _every_sampled_point_is_correct(build_checker, [w], 4)


ALTERNATE = {"packed_output": 0, "ow_block": 2, "oh_block": 2, "reduce_order": "rs_c_c", "unroll_window": 1,
             "cache_write": "global", "order": "SRSRS:outer", "algorithm": "direct"}  # another point of each template,
# where it has the value (the pointwise conv's default is the GEMM: here the direct algorithm)


@pytest.mark.full  # a whole model imported and built
def test_a_tiny_model_built_with_packed_convolutions_matches_pytorch(tmp_path):
    """small-cnn@tiny built with its convolutions packed, their weights at build time (a padded 3x3
    conv with 3 input channels, bias and ReLU: by columns by default; a depthwise 3x3 conv of stride 2 with batch
    norm: by rows by default; a pointwise conv) and its matmul tiled (its weight packed too), at each template's
    default and at another point (every convolution direct), against PyTorch. (A model built with Winograd:
    tests/test_winograd_fused.py.)"""
    import tvm
    from tvm import relax, s_tir

    from opbench.hardware.targets import make_target
    from opbench.space import get_template
    from opbench.studies.models.tuned import TunedOp, apply_database, prepacked, write_database
    from opbench.workloads import parse_workload
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.extract import fuse, fused_ops, import_model

    model = "small-cnn@tiny"
    source = load_model(model)
    mod = fuse(import_model(source))  # the weights of this instance, bound as constants
    workloads = [parse_workload(model_name(model, op.name, 1, 128)) for op in fused_ops(mod)[0]]
    templates = {w.name: get_template(w) for w in workloads if get_template(w).name != "fused"}
    packed = [w for w in workloads if w.name in templates and templates[w.name].name.endswith("_nchwc")]
    assert {t.name for t in templates.values()} == {"fused_conv2d_nchwc", "fused_depthwise_conv2d_nchwc", "fused_matmul"}
    assert len(packed) == 3
    target = make_target("llvm", 1)
    points = {"default": {}, "alternate": ALTERNATE}
    expected = {"default": ["columns", "gemm", "rows"], "alternate": ["direct"] * 3}
    for point, values in points.items():
        tuned = []
        for w in workloads:
            if w.name in templates:
                knobs = {k.name: k.choices for k in templates[w.name].knobs(w)}
                config = {k: v for k, v in values.items() if v in knobs.get(k, ())}
                tuned.append(TunedOp(w, templates[w.name], templates[w.name].validate(config, w), 1.0))
        algorithms = {op.workload.name: op.config.get("algorithm", "direct") for op in tuned}
        assert sorted(algorithms[w.name] for w in packed) == expected[point]
        built = apply_database(mod, write_database(tmp_path / point, tuned, target), target)
        # the direct convolutions pack their data, the columns and the stride-2 rows split it into phases (5-D
        # buffers), the GEMM reads it where it lies; the matmul, the direct convolutions and the GEMM take weights
        # packed at build time (the columns and the rows read theirs as they lie)
        assert prepacked(built) == sorted(f"{w.params['func']}_prepacked" for w in workloads
                                          if w.name in templates and algorithms.get(w.name) not in ("columns", "rows"))
        assert not [g for g in built.functions if "weight_prepack" in g.name_hint]  # folded on the constants
        names = {g.name_hint for g in built.functions}
        for w in packed:
            func = w.params["func"] + ("_prepacked" if f"{w.params['func']}_prepacked" in names else "")
            sch = s_tir.Schedule(tvm.IRModule({"main": built[func]}))
            packs_data = any(len(b.shape) == 5 for b in sch.get(sch.get_sblock("root")).alloc_buffers)
            assert packs_data == (algorithms[w.name] != "gemm"), sch.mod
        vm = relax.VirtualMachine(tvm.compile(built, target), tvm.cpu())
        out = vm["main"](*(tvm.runtime.tensor(a) for a in source.numpy_inputs()))
        np.testing.assert_allclose(out.numpy(), source.reference()[0], rtol=1e-3, atol=1e-3, err_msg=point)


@pytest.mark.slow
def test_softmax_and_gelu_use_fast_math_that_vectorises():
    """libm's ``expf``/``erff`` calls do not vectorise (BERT-base's GELU took 1.1 ms, 0.07 ms fast):
    a model's exp and erf are TVM's fast float32 approximations, which the model checks against PyTorch."""
    from opbench.workloads.models.extract import fuse, fused_ops, import_model

    funcs = fused_ops(fuse(import_model(load_model("bert-base@tiny"))))[1]
    scripts = {name: func.script() for name, func in funcs.items()}
    assert any("gelu" in name for name in scripts) and any("softmax" in name for name in scripts)
    assert not [name for name, text in scripts.items() if "T.erf(" in text or "T.exp(" in text]


def test_a_whole_model_is_timed_by_the_one_timing_policy():
    """A fast model's placements each repeat it for at least min_repeat_ms; a slow one takes its fewest repeats
    and no warm-up repeat after its first run."""
    from opbench.measure.timing import MIN_REPEATS, WARM_CALL_S, TimingPolicy
    from opbench.settings import MIN_REPEAT_MS

    policy = TimingPolicy(repeat=5, min_repeat_ms=MIN_REPEAT_MS)
    number, repeat = policy.series_shape(0.010, lambda: time.sleep(0.010))  # MobileNetV2-like: 10 ms a run
    assert number * 0.010 >= MIN_REPEAT_MS / 1e3 and repeat == 5 and policy.warmup_repeats(0.010) == 1
    assert policy.series_shape(26.0, lambda: None) == (1, MIN_REPEATS)  # untuned BERT: 26 s a run
    assert policy.warmup_repeats(26.0) == 0 and policy.warmup_repeats(WARM_CALL_S) == 0  # its check warmed it up


def test_metaschedule_spreads_a_small_budget_so_every_task_gets_a_round():
    from opbench.studies.models.metaschedule import MAX_TRIALS_PER_ITER, trials_per_round

    assert trials_per_round(192, 40) == 4  # 40 rounds of 4 before any task gets a second one
    assert trials_per_round(10, 40) == 1  # fewer trials than tasks: one each while they last
    assert trials_per_round(100_000, 10) == MAX_TRIALS_PER_ITER  # a large budget: tune_relax's own round


def test_a_kept_tuning_is_found_again_only_under_the_same_key(tmp_path):
    from dataclasses import replace

    from opbench.studies.models.reuse import ReuseKey, TunedCache

    key = ReuseKey.here("bert-base@tiny", 1, 128, 2, 16, 12, "optuna-tpe, seed 0")
    cache = TunedCache(tmp_path, key)
    assert cache.records() is None and cache.metaschedule(40) is None and cache.note == ""
    records = {"fused_matmul": [TrialRecord(latency_ms=1.5, knobs={"tile": "8x8"})], "softmax": [TrialRecord(latency_ms=0.2)]}
    cache.save_records(records)
    database = tmp_path / "ms-work"
    database.mkdir()
    (database / "database_tuning_record.json").write_text("[]\n")
    cache.save_metaschedule(40, database)
    again = TunedCache(tmp_path, key)
    assert again.records() == records and (again.metaschedule(40) / "database_tuning_record.json").exists()
    assert again.metaschedule(41) is None  # another budget: MetaSchedule tunes anew
    assert again.note.startswith(f"reused from {again.folder}: operator records of ") and "MetaSchedule's database" in again.note
    for changed in (replace(key, device_key="GenuineIntel/6.143.8/2c/0badf00d"), replace(key, tvm_version="0.28.0"), replace(key, threads=1),
                    replace(key, trials_per_op=32), replace(key, seq_len=64), replace(key, templates="edited"),
                    replace(key, pipeline=key.pipeline + 1)):
        assert TunedCache(tmp_path, changed).records() is None  # another host, TVM, budget, shape, template or fusion


def test_a_frameworks_export_is_made_once_per_key_and_a_failed_one_keeps_nothing(tmp_path):
    from opbench.studies.models.reuse import ReuseKey, TunedCache

    made = []

    def make(path):
        made.append(path.name)
        path.write_text("package")
        return path

    def fail(path):
        path.write_text("half")
        raise RuntimeError("the exporter crashed")

    key = ReuseKey.here("resnet-50@tiny", 1, 128, 2, 4, 3, "optuna-tpe, seed 0")
    first = TunedCache(tmp_path, key).export("inductor-torch2.13.0.pt2", make)
    again = TunedCache(tmp_path, key)
    assert again.export("inductor-torch2.13.0.pt2", make) == first and first.read_text() == "package"
    assert made == ["partial-inductor-torch2.13.0.pt2"]  # made once, under a name with the same suffix
    assert "inductor-torch2.13.0.pt2 of " in again.note
    with pytest.raises(RuntimeError):
        again.export("model-torch2.13.0.onnx", fail)
    assert not (again.folder / "exports" / "model-torch2.13.0.onnx").exists()
    assert again.export("model-torch2.13.0.onnx", make).read_text() == "package"  # the next run makes it anew


def test_an_eager_convolution_is_known_by_its_sizes_stride_and_padding():
    from opbench.studies.models.eager_ops import OTHER, eager_signature

    args = [None, None, None, [2, 2], [1, 1], [1, 1], 1]
    assert eager_signature("aten::conv2d", [[1, 64, 56, 56], [128, 64, 3, 3], [128]], args) == \
        ("conv", 1, 64, 128, 3, 3, 28, 28)
    dilated = [None, None, None, [1, 1], [2, 2], [2, 2], 1]  # DeepLab's atrous 3x3 keeps its size
    assert eager_signature("aten::conv2d", [[1, 64, 56, 56], [64, 64, 3, 3]], dilated)[-2:] == (56, 56)
    assert eager_signature("aten::linear", [[1, 128, 768], [3072, 768], [3072]], [None] * 3) == ("gemm", 128, 3072, 768)
    assert eager_signature("aten::relu", [[1, 8]], [None]) == OTHER


def test_a_convolution_computed_padded_is_known_by_what_it_keeps():
    """SqueezeNet's classifier, 1000 channels computed as 1008 and its 13x13 pixels as a row of 176, both cropped
    (output_channels_padded, pixels_as_one_row), is eager's 512 -> 1000 convolution at 13x13 in that row form; its
    stem, 111 columns computed as 112, eager's 111-column one."""
    from opbench.studies.models.eager_ops import eager_signature, fused_signature
    from opbench.studies.models.openvino_ops import _convolution
    from opbench.workloads.models.extract import FusedOp

    classifier = FusedOp("fused_conv2d17_strided_slice9_strided_slice10_add13_relu13", "conv2d",
                         [(1, 512, 1, 176), (1008, 512, 1, 1), (1, 1000, 1, 1), (1, 1000, 1, 169)], "float32", 0.0, 1)
    stem = FusedOp("fused_conv2d_strided_slice_add_relu", "conv2d",
                   [(1, 3, 224, 224), (64, 3, 3, 3), (1, 64, 1, 1), (1, 64, 111, 111)], "float32", 0.0, 1)
    eager = eager_signature("aten::conv2d", [[1, 512, 13, 13], [1000, 512, 1, 1]], [None, None, None, [1, 1], [0, 0],
                                                                                  [1, 1], 1])
    openvino = _convolution([1, 512, 13, 13], [1000, 512, 1, 1], [1, 1000, 13, 13], None)  # a layer without its node
    int8 = FusedOp("fused_conv2d17_add9_relu9", "conv2d", [(1, 512, 13, 13), (1000, 512, 1, 1), (1, 1000, 13, 13)],
                   "int8", 0.0, 1)  # not rewritten: its rows kept
    assert fused_signature(classifier) == fused_signature(int8) == eager == openvino == ("conv", 1, 512, 1000, 1, 1, 1, 169)
    assert fused_signature(stem) == ("conv", 1, 3, 64, 3, 3, 111, 111)


@pytest.mark.slow
@pytest.mark.parametrize("model, kinds, openvino_kinds", [
    ("resnet-50@tiny", {"conv"}, {"conv"}), ("bert-base@tiny", {"gemm", "softmax", "layer_norm"}, {"gemm"}),
    ("dcgan@tiny", {"conv", "gemm"}, {"conv", "gemm"}), ("resnet3d-18@tiny", {"conv", "gemm"}, {"conv", "gemm"})])
def test_our_operators_are_matched_with_eagers_and_openvinos_by_what_they_compute(model, kinds, openvino_kinds, tmp_path):
    from opbench.studies.models.eager_ops import OTHER, match, ours, profile_eager
    from opbench.studies.models.openvino_ops import profile_openvino
    from opbench.workloads.models.cache import extract
    from opbench.workloads.models.exports import onnx_file

    ops = extract(model, 1, 32)[0]
    source = load_model(model, 1, 32)
    openvino = profile_openvino(onnx_file(source, tmp_path / "model.onnx"), source.inputs, runs=2, threads=2)
    rows = match(ours(ops, {op.name: 1.0 for op in ops}), {"eager": profile_eager(source, runs=2, threads=2),
                                                            "openvino": openvino})

    def twins(baseline):
        return [r for r in rows if r.signature != OTHER and r.ours_ms == r.ours_ms and r.theirs_ms[baseline] > 0]

    assert {r.signature[0] for r in twins("eager")} == kinds
    anchors = [op for op in ops if op.kind in ("conv2d", "conv3d", "matmul", "softmax", "layer_norm")]
    assert sum(r.ours_ms for r in twins("eager")) == len(anchors)  # every anchor found its eager twin
    assert {r.signature[0] for r in twins("openvino")} == openvino_kinds  # (its attention is one fused layer)
    convolutions = [op for op in ops if op.kind in ("conv2d", "conv3d")]  # sub-pixel and depth-unfolded forms too
    assert sum(r.ours_ms for r in twins("openvino") if r.signature[0] == "conv") == len(convolutions)
    assert rows[-1].signature == OTHER  # and the rest is one row, last
    assert rows[0].theirs_ms["eager"] == max(r.theirs_ms["eager"] for r in rows[:-1] if r.theirs_ms["eager"] > 0)


def test_a_tuning_that_kept_every_default_is_the_defaults_build():
    from opbench.space import get_template
    from opbench.studies.models.tune import _all_defaults
    from opbench.studies.models.tuned import TunedOp
    from opbench.workloads import parse_workload

    ops = []
    for name in ("matmul-512", "bert-base-layernorm"):
        workload = parse_workload(name)
        template = get_template(workload)
        ops.append(TunedOp(workload, template, template.validate(template.default_config(workload), workload), 1.0))
    assert _all_defaults(ops, 2)
    assert not _all_defaults(ops, 3)  # an operator kept TVM's lowering: not the defaults' build
    matmul = ops[0]
    other = {**matmul.config, "unroll_max_step": 0 if matmul.config["unroll_max_step"] else 16}
    assert not _all_defaults([TunedOp(matmul.workload, matmul.template, other, 1.0), ops[1]], 2)


@pytest.fixture(scope="module")
def bert_tiny(tmp_path_factory):
    """bert-base@tiny (seq 32) fused, its inputs saved, its single-output matmuls (the most work first), and
    a builder of it with given schedules (``schedule``: the template default, or that with ``changes``)."""
    from opbench.hardware.targets import make_target
    from opbench.measure.models import export_model, save_inputs
    from opbench.space import get_template
    from opbench.studies.models.tuned import TunedOp, apply_database, write_database
    from opbench.workloads import parse_workload
    from opbench.workloads.fused import model_name
    from opbench.workloads.models.extract import fuse, fused_ops, import_model

    folder = tmp_path_factory.mktemp("bert-tiny")
    source, target = load_model("bert-base@tiny", 1, 32), make_target("llvm", 1)
    mod = fuse(import_model(source))
    ops = fused_ops(mod)[0]
    largest_first = sorted(ops, key=lambda o: -o.calls * math.prod(o.shapes[-1]) * o.shapes[0][-1])  # calls x MACs
    matmuls = [o.name for o in largest_first if o.kind == "matmul" and o.outputs == 1]

    def schedule(name, changes=None):
        workload = parse_workload(model_name("bert-base@tiny", name, 1, 32))
        template = get_template(workload)
        return TunedOp(workload, template, template.validate({**template.default_config(workload), **(changes or {})},
                                                             workload), 1.0)

    def build(tuned, name):
        built = apply_database(mod, write_database(folder / name, tuned, target), target)
        return built, export_model(built, target, folder / f"{name}.so")

    return SimpleNamespace(ops=ops, matmuls=matmuls, schedule=schedule, build=build,
                           inputs=save_inputs(source.numpy_inputs(), folder / "inputs.npz"))


@pytest.mark.xdist_group("bert-tiny")
def test_a_built_models_operators_are_timed_call_by_call_inside_it_in_a_worker(bert_tiny, measurer):
    from opbench.studies.models.eager_ops import ours
    from opbench.studies.models.tuned import prepacked

    ops = bert_tiny.ops
    built, library = bert_tiny.build([bert_tiny.schedule(name) for name in bert_tiny.matmuls], "defaults")
    assert prepacked(built)  # the template defaults: weights prepacked
    per_run, failed = measurer.profile_models([(library, bert_tiny.inputs), (Path("missing.so"), bert_tiny.inputs)],
                                              Resources(1))
    assert failed == {}  # a build that cannot load: no profile, not a dead study
    anchors = {op.name for op in ops if op.kind in ("matmul", "softmax", "layer_norm")}
    assert anchors <= set(per_run)  # a prepacked operator under its own name (a plain reshape is no kernel)
    assert all(ms > 0 for ms in per_run.values()) and not any(n.endswith("_prepacked") for n in per_run)
    gemms = sum(per_run[op.name] for op in ops if op.kind == "matmul")
    assert sum(t.ms for t in ours(ops, per_run) if t.signature[0] == "gemm") == pytest.approx(gemms)


def _poor(schedule, name):
    """A matmul's schedule an order of magnitude slower than its default: no tiling, vectorising, unrolling
    or parallel loop."""
    space = schedule(name).template.search_space(schedule(name).workload)
    return schedule(name, {**{k: space[k]["_value"][0] for k in ("i_split", "j_split", "k_inner")}, "order": "SRSSR:root",
                           "parallel": 0, "vectorize": 0, "unroll_max_step": 0, "unroll_explicit": 0})


@pytest.mark.xdist_group("bert-tiny")
def test_a_choice_slower_inside_the_model_than_its_default_gives_way_to_it(bert_tiny, measurer):
    """Real builds profiled inside the model: an operator whose tuned schedule is the slower one there goes
    back to its default, one whose default is the slower keeps its tuned schedule, one left on TVM's default
    lowering (nothing beat it alone) takes its default where that is faster there, and the rest are untouched.
    The operators' times come from the profile of the real build, set by which schedule is the poor one
    there: a busy host can reorder real timings of a model this small."""
    from opbench.studies.models.in_model import keep_faster_in_model
    from opbench.studies.models.tuned import is_default

    first, second, lowered, *rest = bert_tiny.matmuls
    chosen = {first: _poor(bert_tiny.schedule, first), second: bert_tiny.schedule(second, {"unroll_max_step": 64}),
              **{name: bert_tiny.schedule(name) for name in rest}}
    defaults = {first: bert_tiny.schedule(first), second: _poor(bert_tiny.schedule, second),
                lowered: bert_tiny.schedule(lowered), **{name: chosen[name] for name in rest}}
    assert not is_default(chosen[second]) and all(is_default(chosen[name]) for name in rest)
    built = []

    def build(ops, name):
        built.append({op.workload.name.split("/")[1].split(",")[0]: op for op in ops})
        return bert_tiny.build(ops, name)[1]

    tuned = bert_tiny.build(list(chosen.values()), "tuned")[1]

    def profile(libraries, runs):
        out = []
        for library, measured in zip(libraries, measurer.profile_models([(lib, bert_tiny.inputs) for lib in libraries],
                                                                        Resources(1), runs)):
            assert {first, second, lowered} <= set(measured)  # each timed under its own name in either build
            poor = (first, lowered) if library == tuned else (second,)
            out.append({**measured, first: 1.0, second: 1.0, lowered: 1.0, **dict.fromkeys(poor, 10.0)})
        return out

    kept = keep_faster_in_model(chosen, defaults, tuned, build, profile)
    assert kept == {**chosen, first: defaults[first], lowered: defaults[lowered]}
    # one build: every default in place
    assert built == [{**chosen, first: defaults[first], second: defaults[second], lowered: defaults[lowered]}]
    untouched = {name: bert_tiny.schedule(name) for name in bert_tiny.matmuls}

    def never(*_):
        raise AssertionError("built or profiled though no operator left its default")

    assert keep_faster_in_model(untouched, untouched, Path("unused"), never, never) == untouched
    assert keep_faster_in_model({}, {first: None}, Path("unused"), never, never) == {}  # no default to go back to


def test_a_models_profile_starts_its_workers_while_it_imports_the_model(tmp_path, monkeypatch):
    """The kernel worker and the model's eager zygote (PyTorch eager is timed in a process forked from it) start in
    the background as the model is imported and fused; nothing is timed before they have started."""
    import threading

    from opbench.measure.measurer import Measurer
    from opbench.studies.models import profile as profiling
    from opbench.studies.models.tune import ModelSpec, profile

    began, importing_began, started, events = threading.Event(), threading.Event(), threading.Event(), []
    imported = profiling.imported

    def warm_up(self, resources, libraries=(), models=()):
        began.set()
        events.append(("warm-up", libraries, models))
        assert importing_began.wait(60), "the model was imported only after its workers had started"
        started.set()

    def importing(*args):
        assert began.wait(60), "the model was imported before its workers began to start"
        events.append(("import", started.is_set()))
        importing_began.set()
        return imported(*args)

    def timed(*args):
        events.append(("timed", started.is_set()))
        return 1.0

    monkeypatch.setattr(Measurer, "warm_up", warm_up)
    monkeypatch.setattr(profiling, "imported", importing)
    monkeypatch.setattr(profiling, "torch_ms", timed)
    monkeypatch.setattr(Measurer, "time_primfunc", lambda *args: timed() * 1e-3)
    with Measurer() as measurer:
        result = profile(ModelSpec("small-cnn@tiny"), measurer, tmp_path, untuned=False)
    assert result.torch_ms == 1.0 and len(result.ops) > 1  # the stub's value: what was timed is not this test's
    assert events[0] == ("warm-up", (), ("small-cnn@tiny",)) and events[1] == ("import", False)  # imported while warming up
    assert all(started for kind, started in events[2:] if kind == "timed")  # timed once the workers started


def test_each_transformers_model_names_the_module_its_eager_zygote_preloads():
    """A wrong family would preload a module that does not exist (the zygote fails) or build from another."""
    import importlib.util

    from opbench.workloads.models.hf import HF_MODELS, hf_module

    for name in HF_MODELS:
        assert importlib.util.find_spec(hf_module(name)) is not None, name


@pytest.mark.parametrize("model", ["resnet-18", "resnet-34", "resnet-101", "resnet-152"])
def test_every_resnet_depth_is_a_model_its_tiny_variant_extracts(model):
    """The ResNets of He et al. by name (random weights, transformers' ResNetConfig): basic blocks to 34 layers,
    bottlenecks beyond; the tiny variant imports into Relax and fuses around its convolutions."""
    from opbench.workloads.models.cache import extract
    from opbench.workloads.models.hf import HF_MODELS

    assert model in model_names() and f"{model}@tiny" in model_names()
    depths, kind = HF_MODELS[model][4]["depths"], HF_MODELS[model][4]["layer_type"]
    assert 2 + (2 if kind == "basic" else 3) * sum(depths) == int(model.split("-")[1])  # stem, blocks' convs, fc
    ops = extract(f"{model}@tiny", 1, 32)[0]
    convs = [op for op in ops if op.kind == "conv2d"]
    shortcuts = 1 if kind == "basic" else 2  # a 1x1 convolution where a stage changes the width or stride
    assert sum(op.calls for op in convs) == 1 + (2 if kind == "basic" else 3) * 2 + shortcuts  # stem, 2 blocks


@pytest.mark.full
def test_tune_model_tunes_a_3d_cnn_and_builds_it(tmp_path, tracking_uri):
    """The seeds' 3-D CNN end to end: profiled operator by operator, the largest key operator tuned, the model built
    with it and checked against PyTorch (timing claims are the benchmark's). Its 3-D convolutions import as 2-D ones
    over depth-unfolded input (tests/test_depth_unfold.py), its frames their batch: the tuned one is one of them.
    DCGAN's generator imports as convolutions and a matmul, the GCN as matmuls (each built against PyTorch by the zoo
    test below; DCGAN's every template point checked)."""
    model, kind = "resnet3d-18@tiny", "conv2d"
    # seed 1: seed 0's first point unrolls the stem's 7x7 window and its register tile, 17 s of LLVM on this
    # test's clock (valid, only slow to compile)
    out = run_cli("tune-model", model, "--seed", "1", "--trials-per-op", "2", "--max-ops", "1", "--verify-rounds", "0",
                  *ONE_PLACEMENT, "--compare", "untuned", "--tracking-uri", tracking_uri, "--study", "zoo",
                  "--storage", f"sqlite:///{tmp_path / 'optuna.db'}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tuned model output matches the reference" in out.stdout and "not verified" in out.stdout
    frame = read_mlflow(["zoo"], tracking_uri)
    assert not frame["status"].isin(["build_error", "run_error", "wrong_result"]).any(), frame["error"].dropna().tolist()
    counts = frame["workload"].value_counts()
    assert (counts == 3).sum() == 1  # the default, then 2 trials, of the largest key operator; the default elsewhere
    assert anchor_kind(counts[counts == 3].index[0].split("/")[1]) == kind
    assert not any(anchor_kind(w.split("/")[1]) == "conv3d" for w in frame["workload"])  # every one unfolded


@pytest.mark.full  # each imported into Relax, built and run
@pytest.mark.parametrize("model, kinds", [("vgg-16", {"conv2d", "pool", "matmul"}),
                                          ("squeezenet1.1", {"conv2d", "concatenate", "pool"}),
                                          ("dcgan", {"conv2d", "matmul"}), ("gcn", {"matmul"}),
                                          ("resnet3d-18", {"conv2d", "pool"}), ("yolov3-tiny", {"conv2d", "resize2d"}),
                                          ("densenet-121", {"conv2d", "concatenate", "pool"}),
                                          ("inception-v3", {"conv2d", "concatenate", "pool"}),
                                          ("gpt2", {"matmul", "softmax", "layer_norm"})])
def test_each_zoo_models_tiny_variant_builds_and_matches_pytorch(model, kinds):
    """The seeds' CNNs and GCN by name (plain PyTorch modules, random weights): the tiny variant imports into
    Relax, fuses around the layers that make it what it is, builds and gives PyTorch's output."""
    import tvm
    from tvm import relax

    from opbench.hardware.targets import make_target
    from opbench.measure.worker._common import first_output
    from opbench.workloads.models.extract import fuse, fused_ops, import_model

    assert model in model_names() and f"{model}@tiny" in model_names()
    source = load_model(f"{model}@tiny")
    mod = fuse(import_model(source))
    found = {op.kind for op in fused_ops(mod)[0]}
    assert kinds <= found and "conv3d" not in found  # ResNet3D's 3-D convolutions unfolded into 2-D ones
    vm = relax.VirtualMachine(tvm.compile(mod, make_target("llvm", 1)), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in source.numpy_inputs()))
    np.testing.assert_allclose(first_output(out), source.reference()[0], rtol=1e-3, atol=1e-3)  # the first head


@pytest.mark.full  # built at two sizes and run
@pytest.mark.parametrize("model, field", [("bert-base@tiny", "seq_len"), ("resnet-18@tiny", "batch")])
def test_a_dynamic_dimension_imported_once_runs_any_size_on_the_next_bucket_up_padded(tmp_path, model, field):
    """BERT's sequence length, a CNN's batch, is one symbolic variable: one import serves every size, each
    bucket is a static build of it, and a size between buckets runs on the next one up, padded, giving eager's
    output at that size (the attention mask hides padded tokens; a padded image is a sample of its own)."""
    from opbench.hardware.targets import make_target
    from opbench.measure.models import export_model
    from opbench.workloads.models.dynamic import BucketedModel, bound, symbolic_module
    from opbench.workloads.models.extract import fuse, fused_ops, import_model

    def at(n):
        return load_model(model, **{"batch": 1, "seq_len": 128, field: n})

    sources = {n: at(n) for n in (4, 5, 8, 9)}
    axis = sources[4].dynamic()
    assert axis.name == field and axis.noun == ("length" if field == "seq_len" else "batch")
    symbolic = symbolic_module(sources[4])
    assert all(symbolic_module(s) is symbolic for s in sources.values())  # imported once for every size
    target = make_target("llvm", 1)
    built = BucketedModel({n: export_model(fuse(bound(sources[n])), target, tmp_path / f"s{n}.so")
                           for n in (4, 8)}, axis)
    for size, bucket in ((4, 4), (5, 8), (8, 8)):
        run = built(sources[size].numpy_inputs())
        assert (run.size, run.bucket) == (size, bucket)
        np.testing.assert_allclose(run.output, sources[size].reference()[0], rtol=1e-4, atol=1e-4)
    assert built(sources[5].numpy_inputs()).describe() == f"{axis.noun} 5 ran on bucket 8 (padded 5 -> 8)"
    with pytest.raises(OpBenchError, match=rf"{axis.noun} 9 is larger than the largest bucket \(8\)"):
        built(sources[9].numpy_inputs())
    one = at(1)  # a size of 1: torch specialises it, so it imports static
    assert fused_ops(fuse(import_model(one)))[0]


def test_a_graph_model_has_no_dynamic_dimension():
    with pytest.raises(OpBenchError, match="'gcn@tiny' has no dynamic dimension"):
        load_model("gcn@tiny").dynamic()


def test_tune_model_at_batch_buckets_runs_a_size_between_them_verified_against_eager(tracking_uri):
    """tune-model --batch-size 4,8: each bucket tuned and verified as a model of its own, the symbolic import made
    once, and the size between them run on bucket 8 and timed beside eager at that size (a token model's
    --seq-len buckets take the same path: the dispatcher's test runs both axes)."""
    model, flag, tag, words, noun = "small-cnn@tiny", "--batch-size", "b", "batch size", "batch"
    study = f"tm-dyn-{tag}"
    out = run_cli("tune-model", model, flag, "4,8", "--between", "6", "--trials-per-op", "1", "--max-ops", "1",
                  *ONE_PLACEMENT, "--verify-rounds", "1", "--compare", "torch", "--tracking-uri", tracking_uri, "--study", study)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("with its dynamic dimensions symbolic") == 1
    assert f"=== bucket: {words} 4" in out.stdout and f"=== bucket: {words} 8" in out.stdout
    assert out.stdout.count("tuned model output matches the reference") == 2
    row = next(line for line in out.stdout.splitlines() if f"{noun} 6 ran on bucket 8 (padded 6 -> 8)" in line)
    assert "not verified" not in row
    client = mlflow.tracking.MlflowClient(tracking_uri)
    for bucket in (4, 8):  # each bucket a study of its own, its parent run naming its size
        exp = client.get_experiment_by_name(f"{study}-{tag}{bucket}")
        parent = client.search_runs([exp.experiment_id], filter_string="tags.`opbench.kind` = 'study'")[0].data
        assert parent.params["seq_len" if tag == "s" else "batch"] == str(bucket)
        # Whether tuned is faster is a benchmark's number; that each speed-up was verified is the contract.
        m = parent.metrics  # one round: the speed-up is that round's two fresh timings' ratio
        assert m["verify_rounds"] == 1
        assert m["verified_speedup_vs_torch_min"] == m["verified_speedup_vs_torch"] == m["verified_speedup_vs_torch_max"]
        assert m["verified_speedup_vs_torch"] == pytest.approx(m["verified_torch_ms"] / m["verified_best_ms"])
        assert parent.tags["claim_vs_torch"] in ("holds", "does not hold")
        frame = read_mlflow([f"{study}-{tag}{bucket}"], tracking_uri)
        counts = frame["workload"].value_counts()
        key_op = frame[frame["workload"] == counts.index[0]]  # the key operator: its default, then one trial ...
        assert len(key_op) == 2 and key_op["knob.algorithm"].nunique() == 2  # ... of its other algorithm, tried first
    exp = client.get_experiment_by_name(study)
    metrics = client.search_runs([exp.experiment_id])[0].data.metrics
    assert metrics[f"bucket_{tag}6"] == 8 and metrics[f"max_abs_err_{tag}6"] < 1e-3 and metrics[f"tuned_vs_eager_{tag}6"] > 0


@pytest.mark.full  # built at two lengths and run
def test_an_onnx_files_named_dimensions_take_the_batch_and_sequence_length(tmp_path):
    """An ONNX file exported with dynamic axes imports (it was refused): its leading named dimension takes
    --batch-size, its other one --seq-len, from one symbolic import; with a sequence axis in every input and the
    output it runs on buckets like a token model."""
    from opbench.hardware.targets import make_target
    from opbench.measure.models import export_model
    from opbench.workloads.models.dynamic import BucketedModel, bound, symbolic_module
    from opbench.workloads.models.extract import fuse, fused_ops

    path = make_onnx(tmp_path / "mlp.onnx", ("batch", "seq"))
    sources = {n: load_model(str(path), 2, n) for n in (3, 4, 8)}
    assert sources[3].dims == {"batch": 2, "seq": 3} and sources[3].inputs[0].shape == (2, 3, 64)
    assert symbolic_module(sources[3]) is symbolic_module(sources[8])
    assert any((2, 3, 64) in op.shapes for op in fused_ops(fuse(bound(sources[3])))[0])
    model = BucketedModel({n: export_model(fuse(bound(sources[n])), make_target("llvm", 1), tmp_path / f"s{n}.so")
                           for n in (4, 8)}, sources[4].dynamic())
    run = model(sources[3].numpy_inputs())
    assert run.bucket == 4
    np.testing.assert_allclose(run.output, sources[3].reference()[0], rtol=1e-4, atol=1e-4)
    for rows, message in ((("batch", "seq", "h"), "dynamic dimensions h, seq besides the batch"),
                          ((16, ""), "input 'X' has an unnamed dynamic dimension 1")):
        with pytest.raises(OpBenchError, match=message):
            load_model(str(make_onnx(tmp_path / "bad.onnx", rows)))


def test_models_lists_which_have_a_dynamic_dimension():
    rows = {line.split()[0]: line for line in run_cli("models", check=True).stdout.splitlines()[2:]}
    assert {"bert-base", "roberta-base", "gpt2"} == {m for m, line in rows.items() if "sequence length (--seq-len)" in line}
    assert {"resnet-18", "vgg-16", "resnet3d-18", "dcgan"} <= {m for m, line in rows.items()
                                                               if "batch size (--batch-size)" in line}
    assert rows["gcn"].split()[-1] == "-"
    assert "its named dimensions" in rows["PATH.onnx"]
