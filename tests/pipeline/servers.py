"""Real servers for the multi-machine tests: a throwaway PostgreSQL cluster on loopback (Debian's
``postgresql`` package, installed by ``.ci/run``) and an MLflow tracking server on top of it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (PATH first, then Debian's layout)."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    return None


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        import psycopg

        dsn = f"host={self.host} port={self.port} user={self.user} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """initdb + pg_ctl start on a free loopback port; stopped and removed afterwards. As root
    the server runs as the ``postgres`` system user (PostgreSQL refuses to run as root)."""
    bin_dir = pg_bin()
    if bin_dir is None:
        message = "PostgreSQL server binaries not found (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="fedcomm-pg-"))
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres", "postgres")
    data, log, port = root / "data", root / "server.log", free_port()
    user = "fedcomm"

    def run(*cmd: str) -> None:
        subprocess.run([*as_user, *cmd], check=True, capture_output=True, timeout=120)

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", user, "-A", "trust", "--no-sync")
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "start")
        try:
            yield Postgres("127.0.0.1", port, user)
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def mlflow_server(backend_uri: str, artifacts: Path) -> Iterator[str]:
    """``mlflow server`` on a free loopback port with ``backend_uri`` as its backend store and
    proxied artifacts under ``artifacts``; yields its http URI."""
    port = free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    log = open(artifacts.parent / "mlflow-server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            str(mlflow),
            "server",
            "--backend-store-uri",
            backend_uri,
            "--artifacts-destination",
            artifacts.as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                text = (artifacts.parent / "mlflow-server.log").read_text()[-3000:]
                raise RuntimeError(f"mlflow server did not start:\n{text}")
            time.sleep(0.5)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
