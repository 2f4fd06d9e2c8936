"""Shared fixtures: one measurer (persistent workers) per test session, private MLflow stores; the tiers."""
from __future__ import annotations

import atexit
import inspect
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

# The suite's runs (and the processes it starts, which inherit this) take short repeats and one placement each
# (a test asserts what a trial does, not how precise its number is; the placement tests set their own), and each
# test's references are its own.
os.environ.update(OPBENCH_MIN_REPEAT_MS="5", OPBENCH_PLACEMENTS="1", OPBENCH_MAX_PLACEMENTS="1",
                  OPBENCH_BASELINE_REUSE_S="0")

from opbench.plugins import load_plugins

# Workers inherit the environment: the faulty-kernel plugin must be named before any starts.
os.environ["OPBENCH_PLUGINS"] = "tests.plugins.faulty"
load_plugins()  # as the entry points do: tests parse the plugin's workloads in-process
ROOT = Path(__file__).resolve().parents[1]
# Nothing may fall back to MLflow's own default store (./mlflow.db): a code path that forgets our URI
# writes here, and the session fails (see the last fixture).
os.environ.pop("MLFLOW_TRACKING_URI", None)


def skip_unless_required(switch: str, reason: str) -> None:
    """Skip for ``reason`` (this machine forbids what the test needs), or fail where ``$OPBENCH_REQUIRE_<switch>``
    says the machine must allow it (``make test`` sets them: there a skip would hide a broken set-up)."""
    if os.environ.get(f"OPBENCH_REQUIRE_{switch}"):
        pytest.fail(f"OPBENCH_REQUIRE_{switch} is set but {reason}")
    pytest.skip(reason)


REAL_STACK_FIXTURES = {"measurer", "farm", "logged", "builder"}
# Calls in a test's source that start processes: subprocesses, the test files' CLI helpers, measurers, farms,
# studies and measurement services.
STARTS_PROCESSES = re.compile(r"subprocess\.|Popen\(|CLI \+|(?<![\w.])(run_cli|run_cli_process|_run|_tune|_model_ops|Measurer|Farm"
                              r"|run_study|measure|service|MeasurementService)\(")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The full tier (``-m full``): tests that start workers, CLIs, trackers or nnictl, i.e. run real
    TVM/NNI/MLflow/RPC. The rest is the fast tier (``make test-fast``: ``-m "not full and not slow"``)."""
    for item in items:
        function = getattr(item, "function", None)
        source = inspect.getsource(function) if function else ""
        if REAL_STACK_FIXTURES & set(getattr(item, "fixturenames", ())) or STARTS_PROCESSES.search(source):
            item.add_marker(pytest.mark.full)


class _XdistGroups:
    @pytest.hookimpl(trylast=True)  # after pytest-xdist's own
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        _group_for_xdist(config, items)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_XdistGroups(), "opbench-xdist-groups")


def _group_for_xdist(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` runs the tests of one ``xdist_group`` on one worker by their node ids' ``@group`` suffix.
    pytest-xdist 3.8 sets it on ``item._nodeid``, which pytest 9.2 no longer reads (its node id is ``item._id``):
    the groups were silently spread over both workers, each building the group's expensive fixtures again. Where
    the suffix is missing, it is set here."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            from _pytest.nodeid import coerce_node_id  # pytest >= 9.2, where the suffix is missing

            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")  # type: ignore[attr-defined]


# The suite's probes and services stay out of the user's own folder (the host-speed history real studies
# judge by): a private runtime folder for this session and every process it starts, removed at exit.
os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="opbench-runtime-")
atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)
# Extracted model operators go to a private cache, not the repository's mlflow/models, removed at exit: one for
# the session, which its xdist workers inherit (each file of it is written whole, so they share it safely and a
# model is imported once, not once a worker).
if not (os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("OPBENCH_MODEL_CACHE")):
    os.environ["OPBENCH_MODEL_CACHE"] = tempfile.mkdtemp(prefix="opbench-models-")
    atexit.register(shutil.rmtree, os.environ["OPBENCH_MODEL_CACHE"], ignore_errors=True)


@pytest.fixture(scope="session")
def measurer(tmp_path_factory):
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions

    options = MeasureOptions(TimingPolicy(repeat=3, min_repeat_ms=5.0), run_timeout_s=30.0,  # only the hanging kernel waits it out
                             lock_path=tmp_path_factory.mktemp("lock") / "timing.lock")
    with Measurer(options) as m:
        yield m


@pytest.fixture(scope="session")
def build_checker(tmp_path_factory):
    """A measurer for tests whose point is that every build is correct: each kernel checked against its
    reference and timed once (one placement of one repeat), its latency not looked at."""
    from opbench.measure.measurer import Measurer
    from opbench.measure.timing import TimingPolicy
    from opbench.measure.types import MeasureOptions

    one = TimingPolicy(repeat=1, min_repeat_ms=1.0, placements=1, max_placements=1)
    options = MeasureOptions(one, run_timeout_s=10.0, lock_path=tmp_path_factory.mktemp("lock") / "timing.lock")
    with Measurer(options) as m:
        yield m


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its tables made once (3.4 s of migrations here, per new store)."""
    from opbench.tracking.mlflow_store import ensure_store

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    ensure_store(f"sqlite:///{path}")
    return path


@pytest.fixture
def tracking_uri(tmp_path, empty_store) -> str:
    """A private MLflow store for one test: a copy of the empty one."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="session", autouse=True)
def no_stray_mlflow_store():
    """MLflow 3's default store is sqlite:///mlflow.db in the working directory: none may appear."""
    stray = [Path.cwd() / "mlflow.db", ROOT / "mlflow.db"]
    before = {p for p in stray if p.exists()}
    yield
    assert not [p for p in stray if p.exists() and p not in before], "something logged to MLflow's default store"


@pytest.fixture(autouse=True)
def the_test_process_keeps_its_cores():
    """Nothing run in the test process may pin it (TVM's pool can pin the calling thread): every
    process it starts afterwards would inherit one core, and every later timing would be wrong."""
    before = os.sched_getaffinity(0)
    yield
    after = os.sched_getaffinity(0)
    os.sched_setaffinity(0, before)  # the tests after this one run as they should
    assert after == before, f"the test left this process pinned to cores {sorted(after)} (was {sorted(before)})"
