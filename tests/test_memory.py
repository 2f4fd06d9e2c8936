"""Each schedule's memory: the mem.* columns match hand computations, see every allocation, tell schedules
apart (packed, Winograd, CUDA shared memory), and reach the record and MLflow."""
from pathlib import Path

import pytest

from opbench.hardware.resources import Resources
from opbench.hardware.targets import make_target
from opbench.measure.memory import allocations, lowered, schedule_memory
from opbench.measure.types import TrialSpec
from opbench.space import get_template
from opbench.tracking import Recorder, read_mlflow
from opbench.workloads import parse_workload

MATMUL = parse_workload("matmul:m=64,n=64,k=64")
# i: 4 outer x 4 middle x 4 inner; j: 2 x 4 x 8; the outer loop parallel
CACHED = {"matmul": {"cache_write": "local"}}  # the default accumulates in place: nothing to find
TILES = {"i_split": "4x4x4", "j_split": "2x4x8", "k_inner": 8, "parallel": 1, "vectorize": 0, "unroll_max_step": 0,
         "unroll_explicit": 0}


def memory(workload, template, config, threads=2, target="llvm"):
    t = get_template(workload, template, target)
    scheduled = t.schedule(workload, t.validate({**t.default_config(workload), **config}, workload))
    return schedule_memory(scheduled, make_target(target, threads), workload.prim_func(), threads)


@pytest.mark.parametrize(("order", "cache_write", "scope", "tile"), [
    ("SSRRS:inner", "local", "mem.local", 4 * 8),  # the register tile: i inner x j inner
    ("SSRRS:outer", "local", "mem.local", (4 * 4) * (4 * 8)),  # the middle x inner tile, per outer iteration
    ("SSRRS:outer", "global", "mem.global", (4 * 4) * (4 * 8)),
])
def test_a_small_matmuls_memory_is_the_hand_computation(order, cache_write, scope, tile):
    mem = memory(MATMUL, "matmul", {**TILES, "order": order, "cache_write": cache_write})
    assert mem["mem.input"] == 2 * 64 * 64 * 4 and mem["mem.output"] == 64 * 64 * 4
    assert mem[scope] == mem["mem.workspace"] == tile * 4  # float32
    assert mem["mem.workspace_total"] == 2 * tile * 4  # allocated inside the parallel loop: once per thread


def test_memory_outside_parallel_loops_counts_once_and_no_cache_allocates_nothing():
    root = memory(MATMUL, "matmul", {**TILES, "order": "SSRRS:root", "cache_write": "local"})
    assert root["mem.local"] == root["mem.workspace"] == root["mem.workspace_total"] == 64 * 64 * 4
    plain = memory(MATMUL, "matmul", {**TILES, "order": "SSRRS:inner", "cache_write": "none"})
    assert plain["mem.workspace"] == 0 and not [k for k in plain if k in ("mem.local", "mem.global")]


@pytest.mark.parametrize(("spec", "template"), [("matmul:m=64,n=64,k=64", "matmul"), ("resnet50-c2", "conv2d_nchwc"),
                                                ("resnet50-c2", "conv2d")])
def test_every_allocation_is_seen(spec, template):
    """The walk that finds buffers inside parallel loops sees at least what TVM's analysis counts as each
    scope's peak (buffers never alive together add up in the walk, not in the peak): nothing allocated
    goes unseen, and a schedule that allocates never reads 0."""
    from tvm import s_tir

    workload = parse_workload(spec)
    t = get_template(workload, template)
    scheduled = t.schedule(workload, t.validate({**t.default_config(workload), **CACHED.get(template, {})}, workload))
    low = lowered(scheduled, make_target("llvm", 2))
    ours: dict[str, int] = {}
    for scope, nbytes, _ in allocations(low):
        ours[scope] = ours.get(scope, 0) + nbytes
    theirs = {scope: int(n) for per_func in s_tir.analysis.calculate_allocated_bytes(low).values() for scope, n in per_func.items()}
    assert set(ours) == set(theirs) and all(ours[scope] >= theirs[scope] > 0 for scope in theirs)
    assert schedule_memory(scheduled, make_target("llvm", 2), workload.prim_func(), 2)["mem.workspace"] == sum(theirs.values())


def test_packed_and_winograd_schedules_need_more_workspace_than_plain_ones():
    conv = parse_workload("resnet50-c2")
    packed = memory(conv, "conv2d_nchwc", {"packed_output": 1, "algorithm": "direct"})
    inlined = memory(conv, "conv2d", {"pad_at": "inline"})
    assert packed["mem.workspace"] > inlined["mem.workspace"] > 0
    winograd = memory(conv, "conv2d_nchwc", {"algorithm": "winograd"})
    assert winograd["mem.workspace"] > packed["mem.workspace"]


def test_a_cuda_schedules_shared_and_local_memory_without_a_gpu():
    mem = memory(parse_workload("matmul:m=256,n=256,k=256"), None, {}, threads=1, target="cuda")
    assert mem["mem.shared"] > 0 and mem["mem.local"] > 0  # codegen only: nothing runs


def test_a_records_memory_reaches_mlflow(measurer, tracking_uri):
    spec = TrialSpec(MATMUL, {**TILES, "order": "SSRRS:inner", "cache_write": "local"}, Resources(2))
    with Recorder("memory", tracking_uri) as recorder:
        record = measurer.measure(spec)
        recorder(record)
    assert record["status"] == "ok", record["error"]
    assert record["mem.local"] == 128 and record["mem.workspace_total"] == 256
    (back,) = read_mlflow(["memory"], tracking_uri).to_dict("records")
    assert {k: v for k, v in back.items() if k.startswith("mem.")} == {k: v for k, v in record.items() if k.startswith("mem.")}


def test_a_library_baseline_reports_only_the_memory_its_library_states(measurer):
    workload = MATMUL
    torch = measurer.measure_library(workload, "torch", Resources(2))
    numpy = measurer.measure_library(workload, "numpy", Resources(2))
    assert torch["status"] == numpy["status"] == "ok"
    m, n = workload.params["m"], workload.params["n"]
    assert torch["mem.torch_allocated"] >= m * n * 4  # its output, as PyTorch's profiler saw it allocated
    assert not [k for k in {**torch, **numpy} if k.startswith("mem.") and k != "mem.torch_allocated"]  # nothing guessed


def test_a_config_over_the_workspace_budget_is_an_invalid_config_naming_it(tracking_uri, capsys):
    import json

    from opbench.cli import main

    config = json.dumps({**TILES, "order": "SSRRS:outer", "cache_write": "local"})  # 2048 bytes of workspace
    argv = ["measure", "matmul:m=64,n=64,k=64", "--config", config, "--json", "--tracking-uri", tracking_uri]
    assert main([*argv, "--max-workspace", "1000"]) == 1
    over = json.loads(capsys.readouterr().out)
    assert over["status"] == "invalid_config" and "2048 bytes" in over["error"] and "--max-workspace 1000" in over["error"]
    assert over["mem.workspace"] == 2048 and "build_s" in over  # lowered, never compiled: it still counts as a trial
    assert main([*argv, "--max-workspace", "2048"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"


def test_latency_and_memory_make_a_pareto_front(tmp_path, tracking_uri, capsys):
    from opbench.cli import main

    assert main(["tune", "matmul:m=64,n=64,k=64", "--objectives", "latency,memory", "--sampler", "nsga2", "--trials", "6",
                 "--seed", "0", "--repeat", "2", "--verify-rounds", "1", "--no-references", "--tracking-uri", tracking_uri,
                 "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--study", "mem-front"]) == 0
    out = capsys.readouterr().out
    assert "Pareto front (latency vs memory):" in out and "mem.workspace" in out
    front = out.split("Pareto front (latency vs memory):", 1)[1].split("Pareto plot:", 1)[0].strip().splitlines()
    assert "verified ms (min-max)" in front[0] and len(front) >= 3  # header, rule, at least one point
    assert not [row for row in front[2:] if "not verified" in row]  # each point's latency timed again, fresh
    plot = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("Pareto plot: "))
    assert Path(plot).stat().st_size > 0
