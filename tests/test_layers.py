"""Imports point down the layers only (DESIGN.md) and form no cycle, function-level and TYPE_CHECKING imports
included."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opbench"
# Bottom to top; a module is in the layer of its longest prefix. A module may import its own layer and any below.
LAYERS = [
    ("opbench.exceptions", "opbench.paths", "opbench.record", "opbench.argtypes", "opbench.lifecycle", "opbench.settings",
     "opbench.urls", "opbench.outages", "opbench._tvm_compat", "opbench._tvm_pool_worker", "opbench.provenance"),
    ("opbench.hardware",),
    ("opbench.workloads",),
    ("opbench.workloads.models",),  # whole models, above the catalogue: registers where fused workloads come from
    ("opbench.space",),
    ("opbench.plugins",),
    ("opbench.measure",),
    ("opbench.tracking",),
    ("opbench.report",),
    ("opbench.predictor",),
    ("opbench.engines",),
    ("opbench.studies",),
    ("opbench.integration",),  # what nnictl runs: the NNI trial, its channel, experiment files, the service
    ("opbench.cli",),
    ("opbench.testing",),  # helpers for tests and benchmarks (a private LAN of hosts): may use any layer
]
FACADE = "opbench"  # opbench/__init__.py re-exports the public API from every layer


def layer_of(module: str) -> int:
    ranked = [(len(p), rank) for rank, prefixes in enumerate(LAYERS) for p in prefixes
              if module == p or module.startswith(p + ".")]
    if not ranked:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to DESIGN.md)")
    return max(ranked)[1]


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imported(path: Path) -> list[tuple[int, str]]:
    """Every opbench module ``path`` imports, wherever the import statement is."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opbench"):
            # `from opbench import settings` imports the module opbench.settings
            found += [(node.lineno, f"{node.module}.{a.name}") if (PACKAGE.parent / node.module.replace(".", "/") /
                                                                     f"{a.name}.py").exists() else (node.lineno, node.module)
                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("opbench")]
    return found


def upward_edges() -> list[str]:
    edges = []
    for name, path in sorted(modules().items()):
        if name == FACADE:
            continue
        for line, target in imported(path):
            if layer_of(target) > layer_of(name):
                edges.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {target}")
    return edges


def import_graph() -> dict[str, set[str]]:
    """Module -> the opbench modules it imports (a name imported from a module counts as that module)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for _, target in imported(path):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target != name and target != FACADE:
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_modules_form_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def external_imports(path: Path) -> set[str]:
    """The top-level packages outside opbench that ``path`` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.partition(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.partition(".")[0] for a in node.names}
    return found


def test_the_cli_reaches_storage_only_through_the_store_interface():
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        assert "mlflow" not in external_imports(path), path
        assert not [t for _, t in imported(path) if t.startswith("opbench.tracking.mlflow_")], path
        assert ".mlflow." not in path.read_text(), f"{path}: a recorder's MLflow writer"


def test_only_the_command_lines_parse_arguments():
    for layer in ("studies", "engines", "tracking", "measure"):
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            assert "argparse" not in external_imports(path), path


def test_every_module_has_a_layer():
    for name in modules():
        if name != FACADE:
            layer_of(name)


def test_no_module_imports_a_layer_above_its_own():
    assert upward_edges() == []


def test_the_check_sees_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from opbench.cli import main\n")
    assert imported(path) == [(2, "opbench.cli")]
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("opbench.nowhere")


def test_the_public_api_is_listed_and_importable():
    import opbench

    assert {"TuneSpec", "run_study", "StudyResult", "EngineSpec", "Measurer", "parse_workload"} <= set(opbench.__all__)
    for name in opbench.__all__:
        assert getattr(opbench, name) is not None
    with pytest.raises(AttributeError):
        opbench.not_an_api  # noqa: B018


def test_benchmarks_call_the_library_not_the_cli():
    for path in (PACKAGE.parent / "benchmarks").glob("*.py"):
        assert not [t for _, t in imported(path) if t == "opbench.cli" or t.startswith("opbench.cli.")], path


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 60


def oversized(path: Path) -> list[str]:
    """What in ``path`` is too long to hold in one's head: the module past its line budget, its long functions."""
    source = path.read_text()
    out = [f"{path.name}: {len(source.splitlines())} lines"] if len(source.splitlines()) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= MAX_FUNCTION_LINES:
            out.append(f"{path.name}: {node.name} is {node.end_lineno - node.lineno + 1} lines")
    return out


def test_modules_and_functions_stay_small(tmp_path):
    assert [line for path in sorted(PACKAGE.rglob("*.py")) for line in oversized(path)] == []
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert oversized(long) == [f"long.py: f is {MAX_FUNCTION_LINES + 1} lines"]


def test_a_benchmarks_results_file_keeps_every_section_as_it_was_written(tmp_path, monkeypatch):
    """Each save rewrites the file with its sections: earlier ones stay as written, not one blank line longer."""
    import datetime
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("_results", PACKAGE.parent / "benchmarks" / "_results.py")
    assert spec is not None and spec.loader is not None
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    times = iter(datetime.datetime(2026, 1, 1, 10, minute) for minute in range(3))  # a section per minute
    monkeypatch.setattr(results, "datetime", SimpleNamespace(date=datetime.date, datetime=SimpleNamespace(now=lambda: next(times))))
    for name in ("first", "second", "third"):
        run = results.Results(name)
        run.print(f"{name} line")
        path = run.save(tmp_path)
    text = path.read_text()
    assert text.count("## ") == 3 and "\n\n\n" not in text
    assert text.endswith("third line\n") and "first line\n\n## second, finished 10:01\n\n" in text


def test_the_quick_study_benchmark_splits_a_runs_wall_time_at_the_lines_that_end_each_phase(monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(PACKAGE.parent / "benchmarks"))
    quick = importlib.import_module("quick_study")
    lines = [(0.5, "opening"), (7.0, "tuning matmul-512 with optuna-tpe: 3 trials"), (12.0, "[reference torch] ok 4.9 ms"),
             (13.0, "[reference numpy] ok 4.4 ms"), (15.0, "[1/3] ok 9 ms"), (19.0, "[3/3] ok 8 ms"),
             (20.0, "verifying: best and references"), (40.0, "schedule  tuned ms"), (40.5, "best config: ..."),
             (41.0, "tuning curve: plots/tuning_curve.png")]  # not the line that ends set-up
    assert quick.phases(lines, 42.0) == [7.0, 6.0, 6.0, 21.0, 2.0]  # they add up to the wall time
    assert len(quick.phases(lines, 42.0)) == len(quick.PHASES)
