"""A throwaway PostgreSQL server (Debian's ``postgresql`` package) in a temporary folder.

For the mirror's benchmark and, through tests/fixtures/postgres.py, its tests:
``initdb`` into a folder, ``pg_ctl`` on a free port, trust authentication on
127.0.0.1. PostgreSQL refuses to run as root, so under root (CI) the folder is
handed to the package's ``postgres`` user (or ``nobody``) and the binaries run
as that user through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from bench._support import free_port, wait_port


class MissingPostgres(RuntimeError):
    """The binaries (or a user to run them as) are not there."""


SUPERUSER = "postgres"


def postgres_bindir() -> Path:
    """Where initdb, pg_ctl and postgres are: Debian keeps them out of PATH, per version."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    raise MissingPostgres(
        "PostgreSQL is not installed: run `make tools` (apt-get install postgresql)"
    )


def _run_as() -> list[str]:
    """The prefix that runs a PostgreSQL binary as a non-root user (empty when not root)."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return ["runuser", "-u", user, "--"]
    raise MissingPostgres("running as root and no 'postgres' or 'nobody' user to run it as")


def _owner() -> tuple[int, int] | None:
    prefix = _run_as()
    if not prefix:
        return None
    entry = pwd.getpwnam(prefix[2])
    return entry.pw_uid, entry.pw_gid


class PostgresServer:
    """One PostgreSQL cluster in ``workdir``, restartable on the same port and data."""

    def __init__(self, workdir: Path, *, durable: bool = False) -> None:
        self.durable = durable
        self.bindir = postgres_bindir()
        self.workdir = workdir
        self.data = workdir / "data"
        self.log = workdir / "postgres.log"
        self.port = free_port()
        self.dsn = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"
        self._prefix = _run_as()
        owner = _owner()
        # The user PostgreSQL runs as must own its directory (and reach it).
        workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(workdir, 0o755)
        # Folders between it and the temporary root (pytest's, say) get search
        # permission for others; nothing above the temporary root is touched.
        top = Path(tempfile.gettempdir()).resolve()
        for parent in workdir.resolve().parents:
            if parent == top or top not in parent.parents:
                break
            os.chmod(parent, os.stat(parent).st_mode | 0o011)
        if owner is not None:
            os.chown(workdir, *owner)
        self._initdb()

    def _pg(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._prefix, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
        )

    def _initdb(self) -> None:
        self._pg(
            "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        # A test server survives a crash of itself, not of the machine; a benchmark's
        # (durable) commits as a production server does: fsync'd WAL at each commit.
        relaxed = [] if self.durable else [
            "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
        ]  # fmt: skip
        options = " ".join(
            [
                *relaxed,
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.workdir}",
                "-c max_connections=50",
                "-c shared_buffers=64MB",
            ]
        )
        proc = self._pg(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log),
            "-o", options, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {proc.stderr}\n{self.tail()}")
        wait_port(self.port)

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode, check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """The postmaster killed: every backend goes, the next start runs crash recovery."""
        self.stop("immediate")

    def psql(self, sql: str, database: str = "postgres") -> str:
        proc = self._pg(
            "psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
            "-p", str(self.port), "-U", SUPERUSER, "-d", database, "-c", sql,
        )  # fmt: skip
        return proc.stdout.strip()

    def new_database(self) -> str:
        """A fresh database; its DSN."""
        name = "t_" + uuid.uuid4().hex[:10]
        self.psql(f"CREATE DATABASE {name}")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
