"""A real PostgreSQL server for the tests: Debian's ``postgresql`` binaries, a cluster made by
``initdb`` in a temporary folder, listening on a free loopback port (and a socket in its own
folder), stopped when the test session ends.

``initdb`` refuses to run as root, so as root the cluster belongs to the ``postgres`` user
(``runuser``). ``CONTEXTFOLD_TEST_POSTGRES_URL`` points the tests at a server of your own
instead (its user must be allowed to ``CREATE DATABASE``). Each test gets a database of its
own (``PostgresServer.new_database``), so tests never see each other's rows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

BIN_DIRS = (
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
)
URL_ENV = "CONTEXTFOLD_TEST_POSTGRES_URL"


def bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are (Debian keeps them off ``PATH``)."""
    for folder in BIN_DIRS:
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One throw-away cluster; ``url`` is its ``postgres`` database as superuser."""

    def __init__(self) -> None:
        self.url = os.environ.get(URL_ENV, "")
        self._root: Path | None = None
        self._as: list[str] = []
        self._bin: Path | None = None

    def start(self) -> None:
        if self.url:
            return
        binaries = bin_dir()
        if binaries is None:
            raise RuntimeError(
                "PostgreSQL is not installed: apt-get install postgresql "
                f"(or set {URL_ENV} to a server of your own)"
            )
        self._bin = binaries
        self._root = Path(tempfile.mkdtemp(prefix="contextfold-pg-"))
        user = "postgres" if os.getuid() == 0 else None
        if user is not None:
            shutil.chown(self._root, user)
            self._as = ["runuser", "-u", user, "--"]
        data, sockets = self._root / "data", self._root / "run"
        self._run(
            "initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"
        )
        self._run("mkdir", str(sockets), plain=True)
        port = _free_port()
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={sockets}"
            " -c fsync=off -c full_page_writes=off -c max_connections=300"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(self._root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, tool: str, *args: str, plain: bool = False) -> None:
        program = tool if plain else str(self._bin / tool)  # type: ignore[operator]
        subprocess.run([*self._as, program, *args], check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        if self._root is None:
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "-D", str(self._root / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self._root, ignore_errors=True)
        self._root = None

    def new_database(self) -> str:
        """The URL of a new, empty database on this server."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        base, _, _ = self.url.rpartition("/")
        return f"{base}/{name}"

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
