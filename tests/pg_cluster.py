"""A throwaway PostgreSQL cluster for the tests (a plain module; the fixture is in conftest.py).

``initdb`` and ``pg_ctl start`` in a temp folder, as the ``postgres`` user when the tests run
as root (PostgreSQL refuses to run as root), listening on a Unix socket in that folder only (no
TCP port), with durability off (fsync, synchronous commit: nothing here must survive a crash).
Each test database is new (:meth:`Cluster.new_database`), owned by an ordinary role ``ale``
(not a superuser, as a site would run the verifier); the cluster is stopped and its folder
removed at the end of the session.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs

ROLE = "ale"
SEARCH = ("/usr/lib/postgresql/*/bin",)


def bin_dir() -> Path | None:
    """The folder with initdb and pg_ctl: Debian's (the newest), else the PATH's."""
    for pattern in SEARCH:
        found = sorted(Path("/").glob(pattern.lstrip("/")), key=lambda p: int(p.parent.name), reverse=True)
        for candidate in found:
            if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
                return candidate
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def unavailable() -> str | None:
    """None when a cluster can be started here, else why not."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary,pool]', the dev extra has it)"
    if bin_dir() is None:
        return "PostgreSQL is not installed (apt-get install postgresql: initdb and pg_ctl)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run the server as"
    return None


@attrs.define
class Cluster:
    root: Path
    bin: Path
    _user: str | None
    _names: Any = attrs.Factory(lambda: itertools.count(1))

    @property
    def socket_dir(self) -> Path:
        return self.root

    def url(self, dbname: str, user: str = ROLE) -> str:
        """A libpq URL for the socket (the host, a folder, percent-encoded)."""
        return f"postgresql://{user}@{quote(str(self.socket_dir), safe='')}/{dbname}"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            user=self._user,
            group=self._user,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def admin(self, sql: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run ``sql`` as the cluster's superuser."""
        import psycopg

        with psycopg.connect(self.url(dbname, user="postgres"), autocommit=True) as conn:
            cur = conn.execute(sql)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []

    def new_database(self, prefix: str = "t") -> str:
        """A new, empty database owned by the role ``ale``; its URL."""
        name = f"{prefix}_{next(self._names)}"
        self.admin(f'CREATE DATABASE "{name}" OWNER {ROLE}')
        return self.url(name)

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):  # already stopped
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def start() -> Cluster:
    """initdb, configure, pg_ctl start; the role ``ale``. Raises with the server's log on failure."""
    found = bin_dir()
    assert found is not None, unavailable()
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="ale-pg-"))  # short: a socket path is at most ~107 bytes
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = Cluster(root, found, user)
    try:
        cluster._run("initdb", "-D", str(root / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{root}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        with (root / "data" / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        cluster._run("pg_ctl", "-D", str(root / "data"), "-l", str(root / "server.log"), "-w", "-t", "60", "start")
        cluster.admin(f"CREATE ROLE {ROLE} LOGIN")
    except BaseException:
        log = root / "server.log"
        detail = log.read_text(errors="replace") if log.exists() else ""
        cluster.stop()
        if detail:
            raise RuntimeError(f"the PostgreSQL cluster did not start:\n{detail}") from None
        raise
    return cluster


@attrs.frozen
class Databases:
    """The verifier's database for a test folder, with one engine: the SQLite file in it, or a
    database of the session's cluster made for it (the same folder, the same database, as with
    SQLite). The verifier tests run once with each engine."""

    engine: str  # "sqlite" | "postgresql"
    cluster: Cluster | None = None
    _made: dict[Path, str] = attrs.Factory(dict)

    def new(self, tmp: Path) -> Path | str:
        if self.cluster is None:
            return tmp / "verifier.sqlite3"
        if tmp not in self._made:
            from ale_verify import db

            db.close()  # the pools of earlier tests' databases (one still in use opens again on use)
            self._made[tmp] = self.cluster.new_database()
        return self._made[tmp]
