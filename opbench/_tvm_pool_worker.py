"""TVM's process pool worker (``tvm.exec.popen_worker``), started after ``import opbench``: TVM imported
without torch (opbench._tvm_compat.light_pool_workers)."""
from tvm.exec.popen_worker import main

if __name__ == "__main__":
    main()
