# Two commands do all set-up: `make demo` and `make test` (both create .venv when missing).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test test-fast lint docs install cross postgres clean

# uv installs in half a minute what pip takes four for. It reads no pip.conf, so the folder of local
# wheels pip is configured with (this machine's CPU build of torch) is handed to it. Where
# PYTHONDONTWRITEBYTECODE is set (this machine, CI) a process would compile torch, TVM and MLflow from
# source at each import (2x the suite's CPU), so make's commands write bytecode, and the install writes it
# for what OpBench's processes import by importing that, in two processes (~6,800 modules: 15-28 s; uv's
# --compile-bytecode compiles all ~21,000 installed: 38 s; leaving them all to the suite: +46 s, its first
# processes compiling the same modules at once). The rest is written on first import.
unexport PYTHONDONTWRITEBYTECODE
FIND_LINKS := $(shell $(PY) -m pip config get global.find-links 2>/dev/null)
IMPORT     := $(BIN)/python -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
IMPORTED_1 := tvm tvm.relax tvm.s_tir.meta_schedule torch._dynamo torch._inductor.compile_fx mlflow \
              mlflow.store.tracking.sqlalchemy_store mlflow.server optuna pandas pyarrow.parquet matplotlib.pyplot
IMPORTED_2 := transformers.models.bert.modeling_bert onnx onnxruntime onnxscript sklearn xgboost scipy.stats nni \
              opbench.cli opbench.studies.tune opbench.studies.models.tune opbench.measure.worker.main \
              opbench.integration.nni.service opbench.tracking.dataset opbench.predictor

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) -e '.[test]'
	$(IMPORT) $(IMPORTED_1) & first=$$!; $(IMPORT) $(IMPORTED_2) && wait $$first
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/opbench demo

# ARM cross compilers for the board presets (pynq-z2, zcu104, rpi4), from Debian; skipped when present.
SUDO      := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
CROSS_GCC := arm-linux-gnueabihf-gcc aarch64-linux-gnu-gcc
cross:
	@if ! command -v $(word 1,$(CROSS_GCC)) >/dev/null || ! command -v $(word 2,$(CROSS_GCC)) >/dev/null; then \
		$(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			gcc-arm-linux-gnueabihf gcc-aarch64-linux-gnu libc6-dev-armhf-cross libc6-dev-arm64-cross; \
	fi

# PostgreSQL (server binaries) for shared studies and their tests, from Debian; skipped when present.
# The tests start a private cluster of their own (initdb in a temporary folder).
postgres:
	@if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		$(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql; \
	fi

# The cross-builds and the second-user tests are part of the suite: OPBENCH_REQUIRE_CROSS and
# OPBENCH_REQUIRE_USERS turn their skips into failures.
# Three workers take tests one by one on two cores: the nnictl, fault and scale-out tests wait on services,
# processes and databases for much of their time (nnictl's: 35 CPU-s in 80 s), and a third worker fills it (on a
# 2-vCPU Zen 4 the same suite took 660 s of pytest with three, 710 s with two). Tests sharing an
# expensive module fixture are grouped (xdist_group); the files with the longest tests go first so that no
# worker is left with one at the end.
SLOWEST_FIRST := tests/test_nnictl.py tests/test_scaleout.py tests/test_models.py tests/test_faults.py \
                 tests/test_quantized_models.py tests/test_engines.py tests/test_remote.py tests/test_data.py
test: lint cross postgres
	OPBENCH_REQUIRE_CROSS=1 OPBENCH_REQUIRE_USERS=1 OPBENCH_REQUIRE_NAMESPACES=1 $(BIN)/python -m pytest -q -n 3 --dist loadgroup --durations=40 $(SLOWEST_FIRST) tests

# ruff (pyflakes, pycodestyle, import order, bugbear, ...) and mypy, as configured in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check opbench tests benchmarks
	$(BIN)/mypy

# What is generated from the code: the command and record references and the presets' search spaces (tests check them).
docs: $(STAMP)
	mkdir -p docs/reference
	$(BIN)/python -m opbench.cli.reference > docs/reference/cli.md
	$(BIN)/python -m opbench.cli.reference records > docs/reference/records.md
	$(BIN)/opbench space --all --out search_spaces

# Unit, schema, contract and CLI-error tests: no worker, CLI process, tracker or nnictl, and no slow kernel sweep
# (<= 3 min in two workers; a test that starts a measurement service or a study in-process is of the full tier).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not full and not slow" tests

clean:
	rm -rf $(VENV) mlflow/mlflow.db mlflow/artifacts mlflow/optuna-journal.log
