"""TVM 0.27 workarounds (opbench._tvm_compat), each in a fresh process: what one changes is what a process starts with."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TVM_THEN_TORCH = """
import sys
import opbench, tvm, tvm.relax, tvm.s_tir.meta_schedule
print("torch at tvm's import:", "torch" in sys.modules)
import numpy as np, torch, tvm_ffi._convert
from tvm import te

a = te.placeholder((4,), "float32", name="a")
kernel = tvm.compile(te.create_prim_func([a, te.compute((4,), lambda i: a[i] * 2.0)]), target="llvm")
out = tvm.runtime.tensor(np.zeros(4, "float32"))
kernel(tvm.runtime.from_dlpack(torch.arange(4, dtype=torch.float32)), out)
print("kernel on torch's tensor:", out.numpy().tolist())
print("torch for tvm_ffi:", tvm_ffi._convert.torch is not None)
"""

TORCH_THEN_TVM = """
import opbench, torch, tvm, tvm_ffi._convert
print("torch for tvm_ffi:", tvm_ffi._convert.torch is torch)
"""

POOL_WORKER = """
import opbench
from tvm.support.popen_pool import PopenWorker

def facts():
    import sys
    return sys.argv[0], "torch" in sys.modules

worker = PopenWorker()
worker.send(facts)
print("pool worker:", worker.recv())
"""


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_tvm_starts_without_torch_and_torch_imported_later_works_with_it():
    out = _run(TVM_THEN_TORCH)
    assert "torch at tvm's import: False" in out  # ~4 s of every TVM process's start on a 2-vCPU host
    assert "kernel on torch's tensor: [0.0, 2.0, 4.0, 6.0]" in out
    assert "torch for tvm_ffi: False" in out  # TVM's optional use stays without it, as where torch is absent


def test_a_process_that_imports_torch_first_gives_tvm_all_of_it():
    assert "torch for tvm_ffi: True" in _run(TORCH_THEN_TVM)


def test_tvm_pool_workers_of_an_opbench_process_start_without_torch():
    """MetaSchedule's builders and runners and an RPC server's process are TVM pool workers."""
    assert f"pool worker: ('{ROOT / 'opbench' / '_tvm_pool_worker.py'}', False)" in _run(POOL_WORKER)
