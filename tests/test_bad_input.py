"""Bad input, thrown at random: configs and command lines for measure and sweep, and trial requests for the
NNI service. Each ends as exit 0/1/2 with a message (never a traceback), and every record it leaves reads back.

Only configs the space rejects are thrown (a valid one would build and time a kernel: the full tier does
that): they are recorded as ``invalid_config`` without starting any worker, so hundreds run in seconds.
"""
from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opbench.cli import main
from opbench.exceptions import ConfigError
from opbench.record import TrialRecord
from opbench.space import get_template
from opbench.testing.lan import free_port
from opbench.tracking import read_jsonl_records, read_mlflow_records
from opbench.workloads import parse_workload

WORKLOAD = "matmul:m=16,n=16,k=16"
KNOBS = [k.name for k in get_template(parse_workload(WORKLOAD)).knobs(parse_workload(WORKLOAD))]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=30), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)
# Real knob names (with any value, a valid one now and then) and made-up ones.
CONFIGS = st.dictionaries(st.sampled_from(KNOBS) | st.text(string.printable, max_size=12), JSON, min_size=1, max_size=4)
FUZZ = settings(deadline=None, database=None, derandomize=True,  # the same examples every run: a failure reproduces
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much])


def rejected(config: dict) -> bool:
    workload = parse_workload(WORKLOAD)
    try:
        get_template(workload).validate(config, workload)
    except ConfigError:
        return True
    return False


def test_random_configs_are_invalid_config_records_through_the_nni_service(tracking_uri, tmp_path):
    """The service NNI's trials send their parameters to: a record naming the knob for each, all read back."""
    from opbench.integration.nni.service.protocol import TrialRequest
    from opbench.integration.nni.service.server import MeasurementService

    service, log, replies = MeasurementService(), tmp_path / "records.jsonl", []

    @settings(FUZZ, max_examples=250)
    @given(config=CONFIGS)
    def throw(config):
        assume(rejected(config))
        reply = service._measure(TrialRequest(WORKLOAD, config, study="fuzz-nni", tracking_uri=tracking_uri,
                                              log=str(log), engine="nni"))
        assert reply.record is not None and reply.record["status"] == "invalid_config"
        assert reply.record["error"].startswith("knob '")
        replies.append(reply.record["trial_id"])

    throw()
    service.close()  # writes what its background writer holds
    assert len(replies) >= 250
    assert {r["trial_id"] for r in read_mlflow_records(["fuzz-nni"], tracking_uri)} == set(replies)
    assert [r["trial_id"] for r in read_jsonl_records(log)] == replies


FLAGS = ["--threads", "--repeat", "--placements", "--max-placements", "--agree", "--max-workspace",
         "--build-timeout", "--run-timeout", "--cores", "--target", "--template", "--device", "--tracker", "--key",
         "--remote-workers", "--connect-timeout", "--bogus"]
VALUES = st.sampled_from(["0", "-1", "1", "2", "x", "1e9", "nan", "inf", "0-999999999", "3-1", "cuda", "llvm",
                          "pynq-z2", "h:70000", "rpc://h:70000/k", "rpc://h:9190/k", "conv2d", "te_default", ""])
ARGS = st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=4)


def test_random_command_lines_exit_0_1_or_2_with_a_message(tracking_uri, tmp_path, capsys):
    log = tmp_path / "records.jsonl"

    @settings(FUZZ, max_examples=60)
    @given(command=st.sampled_from(["measure", "sweep"]), args=ARGS, config=CONFIGS)
    def throw(command, args, config):
        assume(rejected(config))
        argv = [command, WORKLOAD, "--config", json.dumps(config), "--tracking-uri", tracking_uri, "--log", str(log),
                "--study", f"fuzz-{command}", *[part for flag, value in args for part in (flag, value)]]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a malformed flag
            code = exc.code
        captured = capsys.readouterr()
        assert code in (0, 1, 2), argv
        assert "Traceback" not in captured.err
        if code == 2:
            assert "error" in captured.err, argv

    throw()
    logged = read_jsonl_records(log) if log.exists() else []
    for study in {r["study"] for r in logged}:
        trial_ids = {r["trial_id"] for r in read_mlflow_records([study], tracking_uri)}
        assert trial_ids == {r["trial_id"] for r in logged if r["study"] == study}
    assert all(r["status"] == "invalid_config" for r in logged)


@pytest.mark.parametrize("config,knob", [({"i_split": 5}, "i_split"), ({"order": None}, "order"),
                                         ({"vectorize": [1]}, "vectorize"), ({"vectorize": True}, "vectorize"),
                                         ({"vectorize": "1"}, "vectorize"), ({"unroll_max_step": 16.5}, "unroll_max_step"),
                                         ({"unroll_max_step": float("inf")}, "unroll_max_step")])
def test_a_knob_of_the_wrong_type_is_an_invalid_config_naming_it(config, knob, tracking_uri, capsys):
    code = main(["measure", "matmul-512", "--config", json.dumps(config), "--json", "--tracking-uri", tracking_uri])
    record = json.loads(capsys.readouterr().out)
    assert code == 1 and record["status"] == "invalid_config" and record["error"].startswith(f"knob '{knob}'")
    (back,) = read_mlflow_records(["measure"], tracking_uri)  # written, though its value is not a choice
    assert back["trial_id"] == record["trial_id"] and back["status"] == "invalid_config"


def test_an_integral_number_stands_for_an_integer_choice():
    workload = parse_workload(WORKLOAD)
    template = get_template(workload)
    config = template.validate({"unroll_max_step": 16.0}, workload)
    assert config["unroll_max_step"] == 16 and type(config["unroll_max_step"]) is int


def test_an_unknown_grid_knob_exits_2_before_anything_runs(tracking_uri, capsys):
    code = main(["sweep", WORKLOAD, "--grid", "tile_q=1,2", "--tracking-uri", tracking_uri])
    assert code == 2 and "--grid: unknown knob(s) tile_q" in capsys.readouterr().err
    with pytest.raises(Exception, match="no MLflow experiment"):  # nothing was recorded
        read_mlflow_records([f"sweep-{parse_workload(WORKLOAD).name}"], tracking_uri)


@pytest.mark.parametrize("argv,flag", [
    (["measure", WORKLOAD, "--repeat", "0"], "--repeat"), (["measure", WORKLOAD, "--placements", "-1"], "--placements"),
    (["measure", WORKLOAD, "--max-workspace", "0"], "--max-workspace"),
    (["tune", WORKLOAD, "--configs-per-step", "0"], "--configs-per-step"), (["measure", WORKLOAD, "--run-timeout", "-1"], "--run-timeout"),
    (["tune", WORKLOAD, "--workers", "0"], "--workers"), (["measure", WORKLOAD, "--agree", "nan"], "--agree"),
    (["ui", "--port", "70000"], "--port")])
def test_numeric_flags_are_checked_when_parsed(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and f"argument {flag}: must be" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["tune", WORKLOAD, "--batch", "2"], ["tune-model", "bert-base@tiny", "--batch", "2"],
                                  ["model-ops", "bert-base@tiny", "--batch=2"], ["demo", "--batch", "2"]])
def test_the_old_batch_flag_exits_2_naming_both_that_replace_it(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    if argv[0] == "demo":  # never one of its flags: refused as unknown, not matched to a longer one
        assert exit_.value.code == 2 and "unrecognized arguments: --batch" in err
    else:
        assert exit_.value.code == 2 and "--batch is gone" in err and "--batch-size" in err and "--configs-per-step" in err


def test_a_flag_is_never_taken_by_its_prefix(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tune", WORKLOAD, "--configs-per", "2"])  # once taken as --configs-per-step
    assert exit_.value.code == 2 and "unrecognized arguments: --configs-per" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["measure", WORKLOAD, "--cores", "0-999999999"], "core range '0-999999999'"),
    (["measure", WORKLOAD, "--cores", "3-1"], "core range '3-1'"),
    (["measure", WORKLOAD, "--tracker", "h:70000", "--key", "k"], "port 70000 of 'rpc://h:70000/k' is not a TCP port"),
    (["measure", WORKLOAD, "--device", "rpc://h:0/k"], "port 0 of 'rpc://h:0/k'")])
def test_core_sets_and_ports_out_of_range_are_refused(argv, message, tracking_uri, capsys):
    assert main([*argv, "--tracking-uri", tracking_uri]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["tune-model", "bert-base@tiny", "--seq-len", "8,8"], "argument --seq-len: must be distinct"),
    (["tune-model", "bert-base@tiny", "--seq-len", "8,x"], "argument --seq-len: expected an integer"),
    (["model-ops", "bert-base@tiny", "--seq-len", "8,16"], "model-ops runs one size, got 8,16"),
    (["model-ops", "resnet-18@tiny", "--batch-size", "1,4"], "--batch-size: model-ops runs one size, got 1,4"),
    (["tune-model", "gcn@tiny", "--batch-size", "1,4"], "model 'gcn@tiny' has no dynamic dimension"),
    (["tune-model", "vit-base@tiny", "--seq-len", "8,16"], "--seq-len buckets: vit-base@tiny's dynamic dimension is "
                                                          "its batch size (--batch-size)"),
    (["tune-model", "bert-base@tiny", "--batch-size", "1,2"], "its sequence length (--seq-len)"),
    (["tune-model", "resnet-18@tiny", "--batch-size", "1,2", "--seq-len", "8,16"], "along one dynamic dimension"),
    (["tune-model", "bert-base@tiny", "--seq-len", "8,32"], "runs at most 16 tokens, so not at length 32"),
    (["tune-model", "bert-base@tiny", "--seq-len", "8,16", "--between", "16"], "and not buckets, got 16")])
def test_buckets_that_cannot_run_exit_2_naming_why(argv, message, tracking_uri, capsys):
    try:
        code = main([*argv, "--tracking-uri", tracking_uri])
    except SystemExit as exit_:  # argparse's own
        code = exit_.code
    assert code == 2 and message in capsys.readouterr().err


def test_an_unknown_system_to_compare_a_model_with_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tune-model", "bert-base@tiny", "--compare", "torch,tensorrt"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unknown system tensorrt; systems: untuned, defaults, metaschedule, torch" in err


def test_a_long_latency_list_survives_mlflow(tracking_uri):
    """MLflow truncates tags past 8,000 characters: the raw repeats live in the run's artifact."""
    from opbench.tracking import Recorder

    latencies = [1.0 + i / 7 for i in range(2000)]  # ~38,000 characters as JSON
    with Recorder("long", tracking_uri) as recorder:
        recorder(TrialRecord(workload=WORKLOAD, trial_id="t-long", latency_ms=1.0, latencies_ms=latencies))
    (back,) = read_mlflow_records(["long"], tracking_uri)
    assert back["latencies_ms"] == latencies


def test_a_junk_dataset_and_a_malformed_predict_config_exit_2_naming_them(tmp_path, capsys):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    assert main(["predictor", "eval", "--model", str(tmp_path), "--data", str(junk)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("junk.parquet" in err or "no saved predictor" in err)
    from opbench.exceptions import OpBenchError
    from opbench.tracking.dataset.export import read_dataset

    with pytest.raises(OpBenchError, match="junk.parquet: not a readable parquet dataset"):
        read_dataset(junk)
    assert main(["predict", WORKLOAD, "--model", str(tmp_path), "--config", "{bad"]) == 2
    assert "--config: malformed JSON" in capsys.readouterr().err


def test_an_edited_model_file_gets_a_cache_of_its_own(tmp_path):
    from opbench.workloads.models.cache import cache_dir

    model = tmp_path / "net.onnx"
    model.write_bytes(b"first version")
    first = cache_dir(str(model), 1, 128)
    assert cache_dir(str(model), 1, 128) == first
    model.write_bytes(b"edited")
    assert cache_dir(str(model), 1, 128) != first
    assert cache_dir("bert-base", 1, 128).name.startswith("bert-base-b1-s128")  # named models: as before


def test_a_models_operators_cached_by_other_model_code_are_not_read(tmp_path, monkeypatch):
    """The operators a ``model:`` workload names come from the code that extracts them now: a cache that other
    model code (or libraries) wrote under the same names is not read."""
    from opbench.workloads.models import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    before = cache.cache_dir("bert-base@tiny", 1, 8)
    monkeypatch.setattr(cache, "_made_by", lambda: "edited-code")
    assert cache.cache_dir("bert-base@tiny", 1, 8) != before and before.parent == tmp_path


def _closed_port() -> str:
    return str(free_port())  # bound once and released: nothing listens on it


@pytest.mark.parametrize("uri,message", [
    ("file:///var/mlruns", "is a file store, which MLflow 3 no longer writes"),
    ("mlruns", "is a file store, which MLflow 3 no longer writes"),
    ("bogus://host/x", "MLflow has no store for 'bogus://'"),
    ("http://127.0.0.1:{port}", "MLflow tracking server http://127.0.0.1:{port} cannot be reached"),
    ("postgresql://me:s3cret@127.0.0.1:{port}/runs", "MLflow tracking database postgresql://me:***@127.0.0.1:{port}/runs "
                                                     "cannot be reached"),
])
def test_a_tracking_uri_mlflow_cannot_use_is_named_at_once(uri, message, capsys, monkeypatch):
    """Named at first contact (exit 2), its password masked: MLflow itself retries an unreachable store
    for minutes, then prints a traceback."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    port = _closed_port()
    code = main(["measure", WORKLOAD, "--tracking-uri", uri.format(port=port)])
    err = capsys.readouterr().err
    assert code == 2 and message.format(port=port) in err and "Traceback" not in err and "s3cret" not in err
