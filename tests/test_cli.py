"""The ``opbench`` command: real processes, real stores, exit codes."""
import json
import subprocess
import sys

import pytest

import mlflow
from opbench.cli import main

from .cli import run_cli

CLI = [sys.executable, "-m", "opbench.cli"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["measure", "nosuchop:m=1"], "unknown operator 'nosuchop'"),
        (["measure", "matmul:m=4"], "missing key(s) n, k"),
        (["measure", "matmul-512", "--config", "{bad"], "malformed config JSON"),
        (["measure", "matmul-512", "--config", "[1]"], "config must be a JSON object"),
        (["measure", "matmul-512", "--config-file", "/nonexistent.json"], "cannot read config file"),
        (["sweep", "matmul-512", "--grid", "i_inner"], "malformed --grid item"),
        (["sweep", "matmul-512", "--threads", "two"], "--threads must be comma-separated integers"),
        (["measure", "matmul-512", "--cores", "0-x"], "malformed core set"),
        (["space", "matmul-512", "--template", "magic"], "unknown template 'magic'"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_knob_is_a_usage_error_not_a_trial(capsys, tracking_uri):
    code = main(["measure", "matmul:m=16,n=16,k=16", "--config", '{"tile_q": 2}', "--json",
                 "--tracking-uri", tracking_uri])
    record = json.loads(capsys.readouterr().out)
    assert code == 1 and record["status"] == "invalid_config" and "knob 'tile_q'" in record["error"]


def test_measure_matmul_512_json(tracking_uri, tmp_path):
    out = run_cli(*["measure", "matmul-512", "--threads", "2", "--json", "--tracking-uri", tracking_uri,
                                "--log", str(tmp_path / "m.jsonl")], check=True)
    record = json.loads(out.stdout)
    assert record["status"] == "ok" and record["latency_ms"] > 0 and record["workload"] == "matmul-512"
    assert json.loads((tmp_path / "m.jsonl").read_text())["trial_id"] == record["trial_id"]


def test_sweep_leaves_one_mlflow_run_per_trial(tracking_uri):
    out = run_cli("sweep", "conv2d:n=1,c=8,h=14,w=14,k=8,r=3,s=3,pad=1", "--template", "conv2d", "--grid", "x_split=7x1x2,7x2x1",
                  "pad_at=inline,outer", "--config", "{\"cache_write\": \"global\"}", "--threads", "1,2",
                  "--tracking-uri", tracking_uri, "--study", "sw", "--repeat", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[8/8]" in out.stderr and "MLflow experiment 'sw'" in out.stdout
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=["sw"], filter_string="tags.`opbench.kind` = 'trial'")
    assert len(runs) == 8
    assert sorted(runs["params.threads"].unique()) == ["1", "2"]
    assert set(runs["tags.status"]) == {"ok"}


def test_ops_and_space_list_the_catalogue(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "bert-base-ffn1" in out and "depthwise_conv2d" in out
    assert main(["space", "resnet50-c2"]) == 0
    assert "ic_block" in capsys.readouterr().out  # convolutions on CPUs: the packed template


def test_progress_counts_the_trials_and_names_the_references(capsys):
    import sys

    from opbench.report.progress import TrialPrinter

    printer = TrialPrinter(2, sys.stdout)
    printer({"reference": "torch", "status": "ok", "latency_ms": 1.0, "gflops": 9.0, "threads": 1})
    printer({"status": "ok", "latency_ms": 2.0, "gflops": 4.0, "threads": 1})
    reference, trial = capsys.readouterr().out.splitlines()
    assert reference.startswith("[reference torch] ok") and trial.startswith("[1/2] ok")
    assert "best 2.0000 ms" in trial and printer.count == 1  # a reference is neither a trial nor the study's best


def test_progress_shows_each_workloads_own_best(capsys):
    import sys

    from opbench.report.progress import TrialPrinter

    printer = TrialPrinter(None, sys.stdout)  # a model's operators tuned one after another
    for workload, latency in (("a", 0.05), ("b", 0.12), ("a", 0.04)):
        printer({"workload": workload, "status": "ok", "latency_ms": latency, "gflops": 1.0, "threads": 1})
    first, second, third = capsys.readouterr().out.splitlines()
    assert "best 0.0500 ms" in first and "best 0.1200 ms" in second and "best 0.0400 ms" in third


def test_a_run_says_how_long_its_placements_waited_for_the_host_where_that_is_long():
    import io

    from opbench.report.progress import SAID_WAIT_S, TrialPrinter

    printer = TrialPrinter(4, io.StringIO())
    for wait in (0.03, SAID_WAIT_S - 1, None):
        printer({"status": "ok", "latency_ms": 1.0, "gflops": 1.0, "threads": 1, "host_wait_s": wait})
    assert printer.host_wait_line() is None  # probing alone, or a short wait: nothing to explain
    printer({"reference": "torch", "status": "ok", "latency_ms": 1.0, "gflops": 1.0, "threads": 1, "host_wait_s": 297.97})
    line = printer.host_wait_line()  # a reference's placements wait as a trial's do
    assert line is not None and line.startswith("placements waited 307 s in all for the host to settle")


def test_a_malformed_or_removed_setting_in_the_environment_is_named(monkeypatch, capsys):
    monkeypatch.setenv("OPBENCH_MIN_REPEAT_MS", "many")
    assert main(["measure", "matmul:m=8,n=8,k=8"]) == 2
    assert "$OPBENCH_MIN_REPEAT_MS must be a number, got 'many'" in capsys.readouterr().err
    monkeypatch.delenv("OPBENCH_MIN_REPEAT_MS")
    monkeypatch.setenv("OPBENCH_SPELL_RERUNS", "1")  # an earlier release's: refused, not ignored
    assert main(["measure", "matmul:m=8,n=8,k=8"]) == 2
    assert "$OPBENCH_SPELL_RERUNS is no longer read (a run in a spell is no longer taken again" in capsys.readouterr().err
    monkeypatch.delenv("OPBENCH_SPELL_RERUNS")
    monkeypatch.setenv("OPBENCH_ISOLATION", "layout,pinning")
    assert main(["measure", "matmul:m=8,n=8,k=8"]) == 2
    assert "$OPBENCH_ISOLATION names pinning; it takes layout, huge-pages or none" in capsys.readouterr().err


def test_the_generated_references_are_current(tmp_path):
    """docs/reference/ and search_spaces/ are what `make docs` writes from the code as it is."""
    from opbench.cli.reference import cli_reference, record_reference
    from opbench.hardware.cpu_shape import CpuShape, shaped_for
    from opbench.space.catalogue import write_spaces

    from .conftest import ROOT

    assert (ROOT / "docs" / "reference" / "cli.md").read_text() == cli_reference(), "stale: run `make docs`"
    records = record_reference()
    assert (ROOT / "docs" / "reference" / "records.md").read_text() == records, "stale: run `make docs`"
    assert "| `latency_ms` | metric | `float` | the estimate: its fastest placement (per call; docs/measurement.md#placements) |" in records
    with shaped_for(CpuShape(256, 16, isa=frozenset({"avx2"}))):  # written on a CPU without AVX-512 or bf16: the same
        written = {p.name: p.read_text() for p in write_spaces(tmp_path)}
    shipped = {p.name: p.read_text() for p in (ROOT / "search_spaces").glob("*.json")}
    assert shipped == written, "search_spaces/ is stale: run `make docs`"
    assert "bert-base-ffn1-bf16.dense_bf16.json" in written
    assert "matmul-512.matmul.json" in written and "resnet50-c2.conv2d_nchwc.json" in written


def test_the_command_leaves_its_imports_out_of_the_teardowns_collections(tmp_path):
    """The command's objects are frozen before the interpreter tears down (its collections then skip them); a call
    from Python leaves the caller's collector alone."""
    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
             "from opbench.cli import main\n"
             "main(['ops'])\n"
             "print('after a call', gc.get_freeze_count() > 0)\n"
             "sys.argv = ['opbench', 'ops']\n"
             "main()\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "after a call False" in out.stdout and out.stdout.rstrip().endswith("frozen True")
