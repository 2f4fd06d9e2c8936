"""Which code measured a number: the commit, and whether the checkout's code differed from it."""
import shutil
import subprocess

import pytest

from opbench import provenance


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    for folder in ("benchmarks/results", "datasets", "opbench"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "file.txt").write_text("first\n")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "first")
    monkeypatch.setattr(provenance, "PROJECT_ROOT", tmp_path)
    return tmp_path


def test_results_and_datasets_written_by_measurements_are_not_changes_to_the_code(checkout):
    clean = provenance.source_commit()
    assert len(clean) >= 7 and "+" not in clean
    for data in ("benchmarks/results", "datasets"):
        (checkout / data / "file.txt").write_text("a measurement\n")
    assert provenance.source_commit() == clean
    (checkout / "opbench" / "file.txt").write_text("edited code\n")
    assert provenance.source_commit() == clean + "+changes"
