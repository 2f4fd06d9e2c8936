"""Another local user: cannot plant, read, replace or connect to this user's service files, and shares the
host's timing lock (with a bounded wait naming the holder). Runs as a real second user (``useradd``, ``runuser``)."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from opbench.exceptions import UnsafePathError
from opbench.hardware.lock import HostLock
from opbench.integration.nni.service.address import authkey
from opbench.paths import private_dir

from .conftest import skip_unless_required

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_COPY = Path(tempfile.gettempdir()) / f"opbench-package-{os.getpid()}"


@pytest.fixture(scope="module")
def other_user():
    """A user of its own for the module, removed after it; skipped only where users cannot be made here."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        skip_unless_required("USERS", "adding a second user needs root and useradd/runuser")
    name = f"opbt{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    # a copy of the package where every user may read it (this checkout may lie in a folder only we enter)
    PACKAGE_COPY.mkdir(mode=0o755)
    shutil.copytree(ROOT / "opbench", PACKAGE_COPY / "opbench", ignore=shutil.ignore_patterns("__pycache__"))
    yield name
    subprocess.run(["userdel", name], check=False, capture_output=True)
    shutil.rmtree(PACKAGE_COPY, ignore_errors=True)


def as_user(user: str, code: str) -> subprocess.CompletedProcess:
    """Python ``code`` run as ``user`` with this checkout on its path: the system's Python (ours may lie in a
    folder only its owner enters; the modules tried here need only the standard library)."""
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    return subprocess.run(["runuser", "-u", user, "--", python, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd="/", env={"PATH": os.environ["PATH"], "PYTHONPATH": str(PACKAGE_COPY),
                                                     "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.fixture
def sticky_tmp():
    """A world-writable sticky folder such as /tmp, private to the test."""
    folder = Path(tempfile.mkdtemp(prefix="opbench-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_another_user_planted_is_refused(other_user, sticky_tmp):
    planted = sticky_tmp / "opbench-0"
    out = as_user(other_user, f"import os; os.mkdir({str(planted)!r}); os.chmod({str(planted)!r}, 0o777)")
    assert out.returncode == 0, out.stderr
    with pytest.raises(UnsafePathError, match="belongs to uid"):
        private_dir(planted)
    link = sticky_tmp / "opbench-link"
    as_user(other_user, f"import os; os.symlink('/etc', {str(link)!r})")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        private_dir(link)
    ours = sticky_tmp / "ours"
    ours.mkdir(mode=0o700)
    ours.chmod(0o770)
    with pytest.raises(UnsafePathError, match="mode 770"):
        private_dir(ours)


def test_another_user_cannot_read_the_key_or_connect_to_the_service(other_user, sticky_tmp, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(sticky_tmp))
    from opbench.integration.nni.service.address import service_dir, socket_path

    sock_path = socket_path("sqlite:////tmp/x.db")
    authkey(sock_path, create=True)
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as server:
        server.bind(str(sock_path))
        server.listen(1)
        probe = as_user(other_user, f"""
import socket, sys
for attempt in (lambda: open({str(sock_path.with_suffix('.key'))!r}, 'rb').read(),
                lambda: socket.socket(socket.AF_UNIX).connect({str(sock_path)!r}),
                lambda: open({str(service_dir() / 'planted.key')!r}, 'wb')):
    try:
        attempt()
        print('GOT IN')
    except PermissionError:
        print('refused')
""")
    assert probe.stdout.split() == ["refused"] * 3, probe.stdout + probe.stderr
    # a key file another user could read, or one that is a link, is never used
    key = sock_path.with_suffix(".key")
    key.chmod(0o644)
    with pytest.raises(UnsafePathError, match="mode 644"):
        authkey(sock_path)
    key.unlink()
    key.symlink_to("/etc/hostname")
    with pytest.raises(OSError):  # ELOOP: never followed
        authkey(sock_path)


def test_another_user_shares_the_timing_lock_and_is_told_who_holds_it(other_user, sticky_tmp):
    path = sticky_tmp / "opbench-timing.lock"
    take = f"""
from opbench.hardware.lock import HostLock, LockTimeout
try:
    with HostLock({str(path)!r}, wait_s=0.5).exclusive():
        print('took it')
except LockTimeout as exc:
    print(exc)
"""
    with HostLock(path).exclusive():
        waited = as_user(other_user, take)
    assert f"held by pid {os.getpid()} (user root)" in waited.stdout, waited.stdout + waited.stderr
    assert as_user(other_user, take).stdout.strip() == "took it"
    assert path.stat().st_mode & 0o777 == 0o644 and path.stat().st_uid == 0  # theirs to lock, not to replace
    path.unlink()  # made by the other user this time: we open theirs, read-only, without O_CREAT
    assert as_user(other_user, take).stdout.strip() == "took it"
    with HostLock(path).shared():
        assert path.stat().st_uid != 0
