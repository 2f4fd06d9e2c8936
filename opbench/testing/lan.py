"""Several hosts in one machine, for the scale-out tests and benchmark: a private PostgreSQL cluster,
an MLflow tracking server on it, and worker "hosts" as network namespaces (each with a hostname of
its own) joined by veth pairs to a private bridge. Servers listen on the bridge's private address
(or loopback) only. Needs root and iproute2 for the namespaces, and PostgreSQL (``make postgres``).
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Unavailable(RuntimeError):
    """This machine does not allow network namespaces."""


def _run(*argv: str) -> None:
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip()[-1000:]}")


class Network:
    """``hosts`` namespaces on a bridge; the bridge (this namespace) has ``server``, host i ``10.N.0.(10+i)``."""

    def __init__(self, hosts: list[str]) -> None:
        tag = f"ob{os.getpid() % 100000}"
        net = 20 + os.getpid() % 200
        self.server, self._bridge, self._namespaces = f"10.{net}.0.1", f"{tag}br", {}
        self._addresses: dict[str, str] = {}
        try:
            _run("ip", "link", "add", self._bridge, "type", "bridge")
        except (RuntimeError, FileNotFoundError) as exc:
            raise Unavailable(f"this machine does not allow network namespaces (they need root and iproute2): {exc}") from exc
        _run("ip", "addr", "add", f"{self.server}/24", "dev", self._bridge)
        _run("ip", "link", "set", self._bridge, "up")
        for i, host in enumerate(hosts):
            ns, outside, inside = f"{tag}-{i}", f"{tag}v{i}", f"{tag}p{i}"
            _run("ip", "netns", "add", ns)
            self._namespaces[host], self._addresses[host] = ns, f"10.{net}.0.{10 + i}"
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            _run("ip", "link", "set", inside, "netns", ns)
            _run("ip", "link", "set", outside, "master", self._bridge, "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self._addresses[host]}/24", "dev", inside)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def address(self, host: str) -> str:
        """``host``'s address on the bridge."""
        return self._addresses[host]

    def on(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host``: in its namespace, under its own hostname."""
        return ["ip", "netns", "exec", self._namespaces[host], "unshare", "--uts", "sh", "-c",
                f'hostname {host} && exec "$@"', "sh", *argv]

    def close(self) -> None:
        for ns in self._namespaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self._bridge], capture_output=True)


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if found is None:
        raise FileNotFoundError(f"PostgreSQL's {name} is missing: `make postgres` installs it")
    return found


class Postgres:
    """A private cluster (trust auth, user ``opbench``) on ``address``; ``url(db)`` creates ``db``."""

    def __init__(self, address: str) -> None:
        self.address, self.port = address, free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="opbench-pg-"))  # the server's user must reach it: not tmp_path
        self._dir.chmod(0o755)
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self._dir, "postgres")
        _run(*self._as, _pg_bin("initdb"), "-D", str(self._dir / "data"), "-U", "opbench", "--auth=trust", "--no-sync")
        with open(self._dir / "data" / "pg_hba.conf", "a") as hba:
            hba.write("host all all samenet trust\n")  # the hosts on the bridge's subnet
        self.start()

    def start(self) -> None:
        options = f"-c listen_addresses={self.address} -p {self.port} -k {self._dir} -c fsync=off"
        _run(*self._as, _pg_bin("pg_ctl"), "-D", str(self._dir / "data"), "-l", str(self._dir / "log"), "-w",
             "-o", options, "start")

    def stop(self) -> None:
        _run(*self._as, _pg_bin("pg_ctl"), "-D", str(self._dir / "data"), "-m", "immediate", "-w", "stop")

    @property
    def running(self) -> bool:
        status = subprocess.run([*self._as, _pg_bin("pg_ctl"), "-D", str(self._dir / "data"), "status"],
                                capture_output=True)
        return status.returncode == 0

    def url(self, db: str) -> str:
        import psycopg2

        connection = psycopg2.connect(host=self.address, port=self.port, user="opbench", dbname="postgres")
        connection.autocommit = True
        with contextlib.closing(connection), connection.cursor() as cursor:
            cursor.execute(f"create database {db}")
        return f"postgresql://opbench@{self.address}:{self.port}/{db}"  # psycopg 3, as users write it

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` with its runs in PostgreSQL and its artifacts proxied, on ``address``."""

    def __init__(self, backend: str, address: str, artifacts: Path) -> None:
        self.uri = f"http://{address}:{free_port()}"
        self._argv = [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", backend,
                      "--artifacts-destination", artifacts.as_uri(), "--host", address,
                      "--port", self.uri.rsplit(":", 1)[1], "--workers", "1", "--allowed-hosts", "*"]
        # MLflow 3's job runner (GenAI scorers: a runner and huey consumers, ~7 s of CPU a start) runs nothing here
        self._env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._log = artifacts.parent / "mlflow-server.log"
        self._proc: subprocess.Popen | None = None
        self.start()

    def start(self, timeout_s: float = 120) -> None:
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(self._argv, stdout=log, stderr=log, start_new_session=True, env=self._env)
        deadline = time.time() + timeout_s
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                return
            assert self._proc.poll() is None, f"mlflow server exited: {self._log.read_text()[-2000:]}"
            assert time.time() < deadline, f"mlflow server not up within {timeout_s} s"
            time.sleep(0.3)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


@contextlib.contextmanager
def lan(hosts: list[str], artifacts: Path) -> Iterator[tuple[Network, Postgres, MlflowServer]]:
    """``hosts`` on a private bridge; PostgreSQL and an MLflow server (its runs in PostgreSQL, its
    artifacts in ``artifacts``) on the bridge's address. Everything is removed on exit."""
    network = Network(hosts)
    cluster = server = None
    try:
        cluster = Postgres(network.server)
        server = MlflowServer(cluster.url("mlflow"), network.server, artifacts)
        yield network, cluster, server
    finally:
        if server:
            server.stop()
        if cluster:
            cluster.close()
        network.close()
