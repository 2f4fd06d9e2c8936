"""The core loop against real TVM: every op kind builds, checks and times; failures are isolated."""
import math
import os
import select
import signal
import subprocess
import sys

import pytest

from opbench.hardware.resources import Resources
from opbench.measure.protocol import RunResult
from opbench.measure.types import TrialSpec
from opbench.measure.worker import fork, kernel, placement
from opbench.record import Status, config_of, is_ok
from opbench.workloads import numpy_dtype, parse_workload

SMALL = {
    "matmul": "matmul:m=64,n=48,k=32",
    "batch_matmul": "batch_matmul:b=2,m=32,n=32,k=16",
    "dense": "dense:m=16,n=64,k=32",
    "conv2d": "conv2d:n=1,c=8,h=14,w=14,k=16,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d": "depthwise_conv2d:n=1,c=16,h=14,w=14,r=3,s=3,stride=2,pad=1",
    "pool2d": "pool2d:n=1,c=8,h=16,w=16,r=3,s=3,stride=2,pad=1,kind=max",
    "softmax": "softmax:m=32,n=64",
    "layer_norm": "layer_norm:m=16,n=64",
    "add_relu": "add_relu:n=1,c=8,h=8,w=8",
}
# A non-default point of each template's space (other orders, scopes, stage placements).
TUNED = {
    "matmul": {"i_split": "8x1x8", "j_split": "1x3x16", "k_inner": 4, "order": "SRSRS:outer", "cache_write": "global",
               "unroll_explicit": 1},
    "batch_matmul": {"i_split": "8x1x4", "j_split": "4x1x8", "order": "SSRSR:inner", "parallel": 2, "unroll_max_step": 512},
    "dense": {"i_split": "8x1x2", "j_split": "2x1x32", "cache_write": "none", "order": "SSRRS:inner"},
    "conv2d": {"oc_block": 4, "ic_block": 2, "ow_block": 7, "reduce_order": "rs_c_c", "packed_output": 0, "parallel": 2,
               "weight_pack_at": "oc_block"},
    "depthwise_conv2d": {"c_block": 8, "ow_block": 7, "packed_output": 0, "unroll_window": 1, "parallel": 1},
    "pool2d": {"c_split": "2x1x4", "x_split": "2x1x4", "pad_at": "outer", "order": "SSRSR:inner", "parallel": 1},
    "softmax": {"inline": 0, "compute_at": "root", "inner_split": 32, "parallel": 0},
    "layer_norm": {"compute_at": "root", "inner_split": 8, "unroll_max_step": 0},
    "add_relu": {"inline": 0, "compute_at": "root", "inner_split": 64, "vectorize": 1},
}


def _ok(record):
    assert record["status"] == "ok", record["error"]
    assert record["latency_ms"] > 0 and math.isfinite(record["latency_ms"])
    assert record["max_abs_err"] < 1e-2
    assert len(record["latencies_ms"]) == record["repeat"] == 3 * record["placements"]
    assert record["latency_lo_ms"] <= record["latency_ms"] <= record["latency_hi_ms"]
    assert record["latency_ms_std"] >= 0 and record["gflops"] > 0


@pytest.mark.parametrize("op", list(SMALL))
def test_every_op_kind_default_and_tuned_configs_are_correct(measurer, op):
    w = parse_workload(SMALL[op])
    default, tuned = measurer.measure_batch([TrialSpec(w, {}, Resources(1)), TrialSpec(w, TUNED[op], Resources(1))])
    _ok(default)
    _ok(tuned)
    for key, value in TUNED[op].items():
        assert tuned[f"knob.{key}"] == value
    assert default["feat.ms_stores"] >= 1 and not math.isnan(default["feat.ms000"])


def test_te_default_schedule_is_measurable(measurer):
    record = measurer.measure(TrialSpec(parse_workload(SMALL["matmul"]), {}, Resources(1), template="te_default"))
    _ok(record)
    assert record["template"] == "te_default"


def test_two_threads_and_a_core_set(measurer):
    w = parse_workload(SMALL["matmul"])
    record = measurer.measure(TrialSpec(w, {}, Resources(2, cores=(0, 1))))
    _ok(record)
    assert record["threads"] == 2 and record["cores"] == "0,1" and record["feat.pinned"] == 1.0


def test_fresh_rounds_reusing_builds_build_a_kernel_once_and_delete_it_at_the_end(measurer, monkeypatch):
    built = []
    build = measurer._builder.build
    monkeypatch.setattr(measurer._builder, "build", lambda inputs: built.append(len(inputs)) or build(inputs))
    spec = TrialSpec(parse_workload(SMALL["matmul"]), TUNED["matmul"])
    with measurer.reusing_builds():
        with measurer.reusing_builds():  # re-entrant: the outer one keeps them
            first = measurer.measure_fresh([spec, spec])
        second = measurer.measure_fresh([spec])
        artifacts = os.listdir(measurer._dir)
        assert artifacts  # kept for later rounds
    assert built == [1]  # one build for three fresh processes
    assert all(r["status"] == "ok" and r["latency_ms"] > 0 and r["max_abs_err"] < 1e-2 for r in [*first, *second])
    assert len({r["worker_pid"] for r in [*first, *second]}) == 3  # each in a process of its own
    assert not set(os.listdir(measurer._dir)) & set(artifacts)  # deleted with the last round
    measurer.measure_fresh([spec])
    assert built == [1, 1] and not set(os.listdir(measurer._dir)) & set(artifacts)  # outside: built and deleted each time


def test_a_studys_fastest_trials_keep_their_builds_for_its_fresh_rounds(measurer, monkeypatch):
    built = []
    build = measurer._builder.build
    monkeypatch.setattr(measurer._builder, "build", lambda inputs: built.append(len(inputs)) or build(inputs))
    w = parse_workload(SMALL["matmul"])
    with measurer.reusing_builds(fastest=1):
        records = measurer.measure_batch([TrialSpec(w, TUNED["matmul"]), TrialSpec(w, {})])
        assert all(r["status"] == "ok" for r in records) and len(os.listdir(measurer._dir)) == 1  # the slower deleted
        fastest = min(records, key=lambda r: r["latency_ms"])
        again = measurer.measure_fresh([TrialSpec(w, config_of(fastest))])  # its config as the record keeps it
        assert built == [2] and again[0]["status"] == "ok"  # the fresh process loaded the trial's own build
        measurer.measure_batch([TrialSpec(w, config_of(fastest))])  # the same kernel again: its new build deleted
        assert len(os.listdir(measurer._dir)) == 1
    assert not os.listdir(measurer._dir)  # deleted with the block


def test_invalid_config_is_recorded_without_building(measurer):
    record = measurer.measure(TrialSpec(parse_workload(SMALL["matmul"]), {"k_inner": 64}, Resources(1)))
    assert record["status"] == "invalid_config"
    assert "knob 'k_inner'" in record["error"] and "build_s" not in record


def test_crashing_hanging_and_wrong_kernels_are_isolated(measurer):
    """A sweep continues past a kernel that kills its process and one that hangs, and records both; the
    crash costs its run's process only, not the worker."""
    specs = [TrialSpec(parse_workload(f"faulty:n=64,mode={mode}"), {}, Resources(1)) for mode in (0, 1, 0, 2, 3, 0)]
    seen = []
    records = [record for spec in specs for record in measurer.measure_batch([spec], on_record=seen.append)]
    assert [r["status"] for r in records] == ["ok", "run_error", "ok", "timeout", "wrong_result", "ok"]
    assert seen == records
    assert "kernel's process died" in records[1]["error"] and "SIGABRT" in records[1]["error"]
    assert records[0]["worker_pid"] == records[2]["worker_pid"] != records[5]["worker_pid"]  # a hang kills the worker
    assert "no answer within" in records[3]["error"]
    assert "max |err|" in records[4]["error"]


def test_sizing_tvms_pool_in_process_keeps_every_core():
    """``runtime.config_threadpool(-3, n, [])`` pins the caller to core 0; set_tvm_threads must not."""
    script = ("import os; from opbench.hardware.resources import set_tvm_threads; before = os.sched_getaffinity(0); "
              "set_tvm_threads(1); print(os.sched_getaffinity(0) == before)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("True"), out.stderr[-2000:]


def test_a_batch_takes_its_placements_interleaved_and_a_wrong_result_none(measurer):
    w = parse_workload(SMALL["matmul"])
    specs = [TrialSpec(w, {}, Resources(1)), TrialSpec(w, TUNED["matmul"], Resources(1)),
             TrialSpec(parse_workload("faulty:n=64,mode=3"), {}, Resources(1))]
    default, tuned, wrong = measurer.measure_batch(specs)
    for record in (default, tuned):
        _ok(record)
        assert record["placements"] >= measurer.options.timing.placements
    assert wrong["status"] == "wrong_result" and "placements" not in wrong and "latency_lo_ms" not in wrong


def test_large_kernel_arguments_start_on_a_huge_page_boundary(monkeypatch):
    import numpy as np

    big, small = np.arange(300_000, dtype="float32").reshape(600, 500), np.ones(16, "float32")
    placed = placement.on_huge_pages_copy(big)
    view = np.from_dlpack(placed)
    assert view.ctypes.data % placement.HUGE_PAGE_BYTES == 0 and np.array_equal(view, big)
    for size in (75_000, 300_000, 700_000) * 3:  # its last huge page too lies inside the mapping, so it can be one
        kept = np.from_dlpack(placement.on_huge_pages_copy(np.ones(size, "float32")))
        start = kept.ctypes.data
        assert -(-(start + 4 * size) // placement.HUGE_PAGE_BYTES) * placement.HUGE_PAGE_BYTES <= _mapping_end(start)
    assert np.array_equal(np.from_dlpack(placement.on_huge_pages_copy(small)), small)
    bf16 = big.astype(numpy_dtype("bfloat16"))  # DLPack has no bfloat16
    placed = placement.on_huge_pages_copy(bf16)
    assert placed.dtype == "bfloat16" and np.array_equal(placed.numpy().astype("float32"), bf16.astype("float32"))
    monkeypatch.setenv("OPBENCH_ISOLATION", "layout")  # huge pages off: where TVM puts it
    assert np.array_equal(np.from_dlpack(placement.on_huge_pages_copy(big)), big)


def _mapping_end(address: int) -> int:
    """The end of this process's mapping that holds ``address``."""
    with open("/proc/self/maps") as maps:
        spans = (tuple(int(x, 16) for x in line.split()[0].split("-")) for line in maps)
        return next(end for start, end in spans if start <= address < end)


def _in_worker(read):
    """``read(pid)`` of a library worker started with this process's environment."""
    from opbench.measure.worker._common import LIBRARY
    from opbench.measure.worker.process import Worker

    worker = Worker(role=LIBRARY)
    worker.start()
    try:
        return read(worker.pid)
    finally:
        worker.close()


def _personality(pid: int) -> int:
    with open(f"/proc/{pid}/personality") as f:
        return int(f.read(), 16)


@pytest.mark.skipif(sys.platform != "linux", reason="personality(2) is Linux's")
def test_workers_run_with_one_address_space_layout_unless_told_not_to(monkeypatch):
    from opbench.measure.worker.layout import ADDR_NO_RANDOMIZE

    assert _in_worker(_personality) & ADDR_NO_RANDOMIZE
    monkeypatch.setenv("OPBENCH_ISOLATION", "huge-pages")  # no fixed layout
    assert not _in_worker(_personality) & ADDR_NO_RANDOMIZE


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/PID/stat is Linux's")
def test_a_workers_stack_starts_at_one_address_whatever_its_environment_holds(monkeypatch):
    from opbench.measure.worker.layout import stack_start

    starts = set()
    for length in (0, 1, 17, 3001):
        monkeypatch.setenv("OPBENCH_TEST_FILLER", "x" * length)
        starts.add(_in_worker(stack_start))
    assert len(starts) == 1


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(sys.platform != "linux", reason="pidfds and /proc are Linux's")
def test_fresh_workers_are_forked_from_a_zygote_that_runs_nothing(tmp_path, monkeypatch):
    import tempfile

    from opbench.measure.protocol import LibraryInput
    from opbench.measure.worker import LIBRARY, Worker
    from opbench.measure.worker.layout import stack_start
    from opbench.measure.worker.process import WorkerError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    zygote = Worker(threads=1, role=LIBRARY, preload=())
    workers = [Worker(threads=1, role=LIBRARY, zygote=zygote) for _ in range(2)]
    try:
        for worker in workers:
            worker.start()
        assert not list(tmp_path.iterdir())  # their logs have no names: a killed parent leaves nothing in /tmp
        assert len({w.pid for w in workers}) == 2 and {_parent(w.pid) for w in workers} == {zygote.pid}
        assert stack_start(workers[0].pid) == stack_start(zygote.pid) == _in_worker(stack_start)  # one layout
        done = workers[0].call(LibraryInput("matmul:m=8,n=8,k=8", "numpy"), timeout=120)
        assert done.status is Status.OK and done.pid == workers[0].pid
        with open(f"/proc/{zygote.pid}/maps") as f:
            assert "libtvm" not in f.read()  # a library zygote never imports TVM
        killed = workers[1].pid
        gone = os.pidfd_open(killed)
        os.kill(killed, signal.SIGKILL)
        select.select([gone], [], [])  # a pidfd reads ready once its process has ended
        os.close(gone)
        assert not workers[1].alive  # seen dead: the next call gets a new worker from the zygote
        again = workers[1].call(LibraryInput("matmul:m=8,n=8,k=8", "numpy"), timeout=120)
        assert again.status is Status.OK and again.pid == workers[1].pid != killed
        assert _parent(workers[1].pid) == zygote.pid
        workers[0].kill()
        assert not workers[0].alive
        os.write(workers[1]._log.fileno(), b"what it said last\n")  # its stderr, as a C++ abort would leave it
        os.kill(workers[1].pid, signal.SIGSTOP)
        workers[1].submit(LibraryInput("matmul:m=8,n=8,k=8", "numpy"))
        os.kill(workers[1].pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"worker died \(.*\): what it said last"):
            workers[1].result(timeout=120)
    finally:
        for worker in [*workers, zygote]:
            worker.close()


def test_a_fresh_worker_for_torch_comes_from_a_zygote_that_imported_it():
    from opbench.measure.protocol import ONNXRUNTIME, LibraryInput, ModelInput
    from opbench.measure.runner.local import _preload

    assert _preload(LibraryInput("matmul:m=8,n=8,k=8", "torch")) == ("torch",)
    assert _preload(LibraryInput("matmul:m=8,n=8,k=8", "numpy")) == ()  # numpy's processes never import torch
    assert _preload(ModelInput("mobilenet-v2@tiny", runtime=ONNXRUNTIME)) == ("torch",)
    # PyTorch eager: and the modeling module that building a transformers model imports (seconds a process)
    assert _preload(ModelInput("mobilenet-v2@tiny")) == ("torch", "transformers.models.mobilenet_v2.modeling_mobilenet_v2")
    assert _preload(ModelInput("small-cnn@tiny")) == ("torch",)  # written here: nothing more to import
    assert _preload(ModelInput("mobilenet-v2@tiny", library="m.so")) == ()  # TVM's Relax VM


@pytest.mark.full  # it starts the zygote processes
@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_warm_up_starts_the_zygotes_of_the_library_baselines_and_eager_models_beside_the_kernel_worker():
    from opbench.measure.protocol import LibraryInput, ModelInput
    from opbench.measure.runner.local import LocalRunner
    from opbench.measure.worker import LIBRARY
    from opbench.measure.worker.zygotes import zygote_of

    one = Resources(threads=1, cores=(0,))
    jobs = {("torch",): LibraryInput("matmul:m=8,n=8,k=8", "torch", resources=one),
            (): LibraryInput("matmul:m=8,n=8,k=8", "numpy", resources=one),
            ("torch", "transformers.models.bert.modeling_bert"): ModelInput("bert-base@tiny", resources=one)}
    zygotes = {pre: zygote_of(one.worker_env(), one.cores, 1, LIBRARY, pre) for pre in jobs}
    for zygote in zygotes.values():
        zygote.kill()  # whatever an earlier test of this process started: warm_up must start them
    assert not any(z.alive for z in zygotes.values())
    runner = LocalRunner()
    try:
        runner.warm_up(one, ("torch", "numpy"), ("bert-base@tiny",))
        assert all(z.alive for z in zygotes.values())  # started with the kernel worker, not by the first job
        for pre, zygote in zygotes.items():
            fresh = runner._fresh_worker(jobs[pre])
            fresh.start()
            assert _parent(fresh.pid) == zygote.pid  # a job's fresh process forks from the zygote warm_up started
            fresh.close()
    finally:
        runner.close()


_MAPPED_AFTER_A_FREE = """
import ctypes
from opbench.measure.worker.layout import fixed_mmap_threshold
fixed_mmap_threshold()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free(ctypes.c_void_p(libc.malloc(1 << 20)))  # glibc raises its threshold past a freed mapped block
block = libc.malloc(512 << 10)
print(ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & 2)  # the chunk's IS_MMAPPED bit
"""


@pytest.mark.skipif(sys.platform != "linux", reason="mallopt(3) is glibc's")
def test_workers_map_a_large_block_on_its_own_whatever_they_freed_before(monkeypatch):
    def mapped() -> bool:
        out = subprocess.run([sys.executable, "-c", _MAPPED_AFTER_A_FREE], capture_output=True, text=True, check=True)
        return out.stdout.strip() == "2"

    assert mapped()
    monkeypatch.setenv("OPBENCH_ISOLATION", "none")  # glibc's own threshold: the 512 KB block comes from the heap
    assert not mapped()


def test_a_run_in_a_forked_child_leaves_the_worker_as_it_was_and_dies_alone():
    seen = []

    def run() -> RunResult:
        seen.append("ran")  # the child's copy of the list only
        return RunResult(Status.OK, latencies_s=[1e-3], pid=os.getpid())

    result = fork.in_child(run)
    assert result.status is Status.OK and result.latencies_s == [1e-3]
    assert result.pid != os.getpid() and seen == []
    failed = fork.in_child(lambda: 1 / 0)
    assert failed.status is Status.RUN_ERROR and "ZeroDivisionError" in failed.error
    killed = fork.in_child(lambda: os.kill(os.getpid(), signal.SIGKILL))
    assert killed.status is Status.RUN_ERROR and "process died (killed by SIGKILL)" in killed.error


def test_cpu_runs_fork_until_the_worker_runs_a_kernel_itself():
    worker = kernel.KernelWorker(None, 1)
    assert worker._pristine("llvm") and not worker._pristine("cuda")  # CUDA does not survive a fork
    worker._pool_here()  # as a co-run does: its pool's threads would not survive a fork either
    assert not worker._pristine("llvm")


def test_a_models_operator_is_timed_in_a_worker_under_the_lock_with_placements(tmp_path):
    """model-ops and tune-model time operators compiled alone through the runner: in a kernel worker's child per
    placement, under the host lock, never in the study's own process."""
    from tvm import te

    from opbench.hardware.lock import HostLock, LockTimeout
    from opbench.hardware.targets import make_target
    from opbench.measure.measurer import Measurer
    from opbench.measure.types import MeasureOptions

    a = te.placeholder((16, 16), name="A")
    b = te.compute((16, 16), lambda i, j: a[i, j] * 2.0, name="B")
    func = te.create_prim_func([a, b])
    lock_path = tmp_path / "timing.lock"
    with Measurer(MeasureOptions(lock_path=lock_path)) as measurer:
        measurer._lock.wait_s = 0.5
        with HostLock(lock_path).exclusive(), pytest.raises(LockTimeout):
            measurer.time_primfunc(func, "llvm", Resources(1))  # another process's timed run holds the host
        assert measurer.time_primfunc(func, make_target("llvm", 1), Resources(1)) > 0  # free: it times

        class Unparsable:
            def script(self, show_meta: bool = False) -> str:
                return "not TVMScript"

        assert math.isnan(measurer.time_primfunc(Unparsable(), "llvm", Resources(1)))  # a failed run, not a dead study


def _worker_children() -> set[int]:
    """This process's own measurement-worker processes: its zygotes (every worker is forked from one)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if _parent(int(pid)) == os.getpid() and b"opbench.measure.worker.main" in f.read():
                    found.add(int(pid))
        except OSError:  # ended meanwhile
            continue
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_measurers_of_one_process_fork_their_workers_from_one_zygote_of_each_kind():
    """Builders and runners of every measurer in a process fork from its zygotes: TVM is imported once per
    kind (1-thread runs and builds are one kind), however many measurers come and go."""
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions

    before = _worker_children()
    spec = TrialSpec(parse_workload(SMALL["matmul"]), {}, Resources(1))
    during = []
    for _ in range(2):
        with Measurer(MeasureOptions(TimingPolicy(repeat=1), build_workers=2)) as measurer:
            assert measurer.measure(spec)["status"] == "ok"
            during.append(_worker_children())
    assert len(during[0] - before) <= 1 and during[0]  # two builders and a runner: one zygote, if not there already
    assert during[1] == during[0]  # the second measurer started no process of its own


def test_onnx_runtime_is_an_int8_operators_library_reference_checked_exactly_before_it_is_timed(measurer):
    from opbench.hardware.resources import host_facts
    from opbench.studies.references import library_references

    conv = parse_workload("conv2d:n=1,c=8,h=9,w=9,k=16,r=3,s=3,stride=1,pad=1,dtype=int8")
    assert library_references(conv, Resources(1)) == ["onnxruntime"]
    record = measurer.measure_library(conv, "onnxruntime", Resources(1))
    assert is_ok(record) and record["latency_ms"] > 0 and record["template"] == "onnxruntime"
    dense = parse_workload("dense:m=4,n=16,k=64,bias=1,dtype=int8")
    record = measurer.measure_library(dense, "onnxruntime", Resources(1))
    if "avx512_vnni" in host_facts().isa:  # VNNI's u8 x i8 products accumulate into i32 exactly
        assert is_ok(record), record.get("error")
    else:  # AVX2's vpmaddubsw saturates pairwise i16 sums of full-range u8 x i8 products
        assert record["status"] == "wrong_result" and "differs from the exact integer product" in record["error"]


def test_a_bf16_workloads_torch_reference_takes_its_bf16_inputs(measurer):
    from opbench.studies.references import library_references

    dense = parse_workload("dense:m=4,n=16,k=24,bias=1,dtype=bfloat16")
    assert library_references(dense, Resources(1)) == ["torch"]  # numpy has no bf16
    record = measurer.measure_library(dense, "torch", Resources(1))
    assert is_ok(record) and record["latency_ms"] > 0
