"""A throwaway PostgreSQL cluster for the tests: Debian's binaries, a temp dir, a local port.

initdb refuses to run as root, so as root (CI, this machine) the cluster runs as an
unprivileged user (``inferloom-pg``, created with useradd when absent) through
``runuser``; as anyone else it runs as that user. ``make postgresql`` installs the
package (apt-get) when it is missing; without it, :func:`find_bin` says why.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PG_USER", "find_bin", "PgCluster"]

PG_USER = "inferloom-pg"


def find_bin() -> Path | None:
    """The newest installed ``/usr/lib/postgresql/N/bin`` that has initdb, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """initdb + pg_ctl start on a temp dir; :meth:`url` gives a fresh database's SQLAlchemy URL."""

    def __init__(self, bindir: Path, fsync: bool = False) -> None:
        """``fsync``: durable commits (the benchmark); the tests run without (faster, nothing to keep)."""
        self.bin = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="inferloom-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        self._dbs = 0
        if self.as_root:
            try:
                pwd.getpwnam(PG_USER)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
                               check=True, capture_output=True)
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, PG_USER, PG_USER)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / tool), *args]
        if self.as_root:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        if p.returncode:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}\n{tail}")
        return p

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        opts += "" if self.fsync else " -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        self._dbs += 1
        name = f"t{os.getpid()}_{self._dbs}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
