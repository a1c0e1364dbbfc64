"""All database access of the verifier: one set of queries on SQLite (WAL) or PostgreSQL.

``DATABASE_URL`` chooses the engine (:func:`location`): ``sqlite:///PATH`` (or a plain path)
for SQLite, in WAL mode, a connection kept by each thread (:meth:`SqliteEngine.kept`);
``postgresql://...`` for PostgreSQL through psycopg 3, one connection pool per process and
database. The queries are written once, in the
SQL both engines share, with ``?`` parameters (the PostgreSQL engine writes them as ``%s``).
Each numbered migration is written once per engine with the same intent; the tests hold the
two schemas to each other (tests/test_verifier_postgres.py).

Every function here is blocking, so callers run it in a worker thread (``await run_db(fn,
...)``); no other module touches SQL. A database that cannot be reached or used raises
:class:`Unavailable` (the API's 503), whatever the engine.

The uploads' writes (a rate limit's take, a challenge, a submission with its audit entry, its
judge jobs and its challenge's use) go through :func:`write`: one thread per process and database
gathers the writes that wait and commits them in one transaction, so concurrent uploads share one
commit (one fsync) instead of queueing for the database's write lock one commit each (group
commit). Each caller returns once the commit that holds its write is durable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import attrs

from ale.core.reasons import REASONS, Level, Reason, Use

if TYPE_CHECKING:
    import psycopg_pool

T = TypeVar("T")

LEVELS = tuple(level.value for level in Level)
RUNNER_KINDS = ("benchmark_team", "approved_third_party", "hardware_attested", "official_rerun")

#: PostgreSQL: connections one process keeps at most, and how long a request waits for one
#: (or for the server, when connecting) before it is answered 503.
POOL_MAX = 10
WAIT_S = 5.0
#: The tables a write transaction may hold against other writers, in the one order every
#: transaction takes them (PostgreSQL's table locks: no two transactions wait for each other).
LOCK_ORDER = ("judge_keys", "submissions", "judge_jobs", "challenges", "rate_events")
#: Writes one commit of :func:`write` holds at most.
MAX_BATCH = 64


@attrs.frozen
class Migration:
    """One numbered step of the schema, written for each engine with the same intent."""

    sqlite: str
    postgresql: str


_SUBMISSIONS_DDL = """
    CREATE TABLE submissions (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        received_at {real} NOT NULL,
        ciphertext_sha256 TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('accepted', 'rejected')),
        level TEXT CHECK (level IS NULL OR level IN
            ('self_reported', 'validated', 'audited', 'officially_verified', 'revoked')),
        reason TEXT,
        reasons TEXT NOT NULL,
        run_id TEXT,
        summary TEXT NOT NULL
    );
    CREATE INDEX submissions_by_level ON submissions(status, level);
"""

# Migration 1's tables, the same on both engines but for two types: SQLite's REAL and
# INTEGER PRIMARY KEY AUTOINCREMENT are PostgreSQL's DOUBLE PRECISION and an identity column.
_TABLES_1 = (
    """
    CREATE TABLE users (
        id TEXT PRIMARY KEY,
        display_name TEXT NOT NULL,
        source TEXT NOT NULL,
        created_at {real} NOT NULL
    );
    CREATE TABLE api_tokens (
        token_sha256 TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        label TEXT NOT NULL,
        created_at {real} NOT NULL,
        revoked_at {real}
    );
    CREATE TABLE challenges (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        nonce TEXT NOT NULL UNIQUE,
        issued_at {real} NOT NULL,
        expires_at {real} NOT NULL,
        used_at {real},
        used_by_submission TEXT
    );
    """
    + _SUBMISSIONS_DDL
    + """
    CREATE TABLE audit_log (
        seq {serial},
        submission_id TEXT NOT NULL,
        at {real} NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        from_level TEXT,
        to_level TEXT,
        reason TEXT NOT NULL
    );
    CREATE TABLE runner_keys (
        key_id TEXT PRIMARY KEY,
        public_key TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL CHECK (kind IN
            ('benchmark_team', 'approved_third_party', 'hardware_attested', 'official_rerun')),
        label TEXT NOT NULL,
        registered_at {real} NOT NULL,
        registered_by TEXT NOT NULL,
        retired_at {real}
    );
    CREATE TABLE rate_events (
        user_id TEXT NOT NULL,
        action TEXT NOT NULL,
        at {real} NOT NULL
    );
    CREATE INDEX rate_events_by_user ON rate_events(user_id, action, at);
    """
)

# Migration 3's tables (docs/verifier.md, "Faithfulness"): the judge keys registered through the
# operator API, the verifier's judge jobs (durable: a restart resumes them; claimed with a lease),
# what re-scoring a submission needs (its task results and release), and which registered key's
# verdict each credited task rests on (so that a revocation finds them).
_TABLES_3 = """
    CREATE TABLE judge_keys (
        key_id TEXT PRIMARY KEY,
        public_key TEXT NOT NULL UNIQUE,
        label TEXT NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('api', 'configuration')),
        registered_at {real} NOT NULL,
        registered_by TEXT NOT NULL,
        revoked_at {real},
        revoked_by TEXT,
        revoke_reason TEXT
    );
    CREATE TABLE judge_jobs (
        submission_id TEXT NOT NULL REFERENCES submissions(id),
        task TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
        input_sha256 TEXT NOT NULL,
        judge_input TEXT,
        attempts INTEGER NOT NULL,
        not_before {real} NOT NULL,
        claimed_by TEXT,
        lease_until {real},
        outcome TEXT,
        last_error TEXT,
        queued_at {real} NOT NULL,
        finished_at {real},
        PRIMARY KEY (submission_id, task)
    );
    CREATE INDEX judge_jobs_due ON judge_jobs(state, not_before);
    CREATE TABLE scoring_inputs (
        submission_id TEXT PRIMARY KEY REFERENCES submissions(id),
        release_sha256 TEXT NOT NULL,
        results TEXT NOT NULL
    );
    CREATE TABLE judge_credits (
        submission_id TEXT NOT NULL REFERENCES submissions(id),
        task TEXT NOT NULL,
        key_id TEXT NOT NULL,
        PRIMARY KEY (submission_id, task)
    );
    CREATE INDEX judge_credits_by_key ON judge_credits(key_id);
"""

MIGRATIONS: list[Migration] = [
    # 1: the initial schema; the audit log refuses UPDATE and DELETE (PostgreSQL: and TRUNCATE,
    # which SQLite does not have)
    Migration(
        sqlite=_TABLES_1.format(real="REAL", serial="INTEGER PRIMARY KEY AUTOINCREMENT")
        + """
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    """,
        postgresql=_TABLES_1.format(
            real="DOUBLE PRECISION", serial="BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
        )
        + """
    CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the audit log is append-only' USING ERRCODE = 'integrity_constraint_violation'; END
    $$;
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
    CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
        FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
    """,
    ),
    # 2: the vocabulary (ale.core.reasons, loaded by migrate()) and triggers that hold every row to it
    Migration(
        sqlite="""
    CREATE TABLE reason_codes (
        code TEXT PRIMARY KEY,
        uses TEXT NOT NULL
    );
    CREATE TABLE levels (name TEXT PRIMARY KEY);
    CREATE TRIGGER submissions_known_codes_insert BEFORE INSERT ON submissions
        WHEN (NEW.reason IS NOT NULL AND NOT EXISTS
                (SELECT 1 FROM reason_codes WHERE code = NEW.reason AND instr(uses, 'rejection') > 0))
          OR (NEW.level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.level))
          OR EXISTS (SELECT 1 FROM json_each(NEW.reasons) AS r WHERE json_extract(r.value, '$.reason')
                     NOT IN (SELECT code FROM reason_codes WHERE instr(uses, 'rejection') > 0
                             OR instr(uses, 'note') > 0))
        BEGIN SELECT RAISE(ABORT, 'unknown reason code or level'); END;
    CREATE TRIGGER submissions_known_codes_update BEFORE UPDATE OF reason, level, reasons ON submissions
        WHEN (NEW.reason IS NOT NULL AND NOT EXISTS
                (SELECT 1 FROM reason_codes WHERE code = NEW.reason AND instr(uses, 'rejection') > 0))
          OR (NEW.level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.level))
        BEGIN SELECT RAISE(ABORT, 'unknown reason code or level'); END;
    CREATE TRIGGER audit_log_known_levels BEFORE INSERT ON audit_log
        WHEN (NEW.from_level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.from_level))
          OR (NEW.to_level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.to_level))
        BEGIN SELECT RAISE(ABORT, 'unknown level'); END;
    """,
        # PostgreSQL's trigger conditions cannot hold subqueries: the same tests are in the functions.
        postgresql="""
    CREATE TABLE reason_codes (
        code TEXT PRIMARY KEY,
        uses TEXT NOT NULL
    );
    CREATE TABLE levels (name TEXT PRIMARY KEY);
    CREATE FUNCTION submissions_known_codes() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF (NEW.reason IS NOT NULL AND NOT EXISTS
                (SELECT 1 FROM reason_codes WHERE code = NEW.reason AND strpos(uses, 'rejection') > 0))
          OR (NEW.level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.level))
          OR (TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM json_array_elements(NEW.reasons::json) AS r(value)
                WHERE r.value ->> 'reason' NOT IN (SELECT code FROM reason_codes
                    WHERE strpos(uses, 'rejection') > 0 OR strpos(uses, 'note') > 0)))
        THEN
            RAISE EXCEPTION 'unknown reason code or level' USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER submissions_known_codes_insert BEFORE INSERT ON submissions
        FOR EACH ROW EXECUTE FUNCTION submissions_known_codes();
    CREATE TRIGGER submissions_known_codes_update BEFORE UPDATE OF reason, level, reasons ON submissions
        FOR EACH ROW EXECUTE FUNCTION submissions_known_codes();
    CREATE FUNCTION audit_log_known_levels() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF (NEW.from_level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.from_level))
          OR (NEW.to_level IS NOT NULL AND NOT EXISTS (SELECT 1 FROM levels WHERE name = NEW.to_level))
        THEN
            RAISE EXCEPTION 'unknown level' USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER audit_log_known_levels BEFORE INSERT ON audit_log
        FOR EACH ROW EXECUTE FUNCTION audit_log_known_levels();
    """,
    ),
    # 3: judge keys, judge jobs, scoring inputs and judge credits (the same on both engines but for REAL)
    Migration(sqlite=_TABLES_3.format(real="REAL"), postgresql=_TABLES_3.format(real="DOUBLE PRECISION")),
]


class Conflict(Exception):
    """A state change that is not allowed (e.g. a challenge already used)."""


class Refused(Exception):
    """The database refused a row (a constraint or trigger: a wrong code, the append-only log)."""


class Unavailable(Exception):
    """The database cannot be reached or used now (HTTP 503); the message has no secret in it."""


class Unstorable(ValueError):
    """A text that one of the engines cannot store (a NUL character): refused on both."""


# -- where the database is ---------------------------------------------------------------------


@attrs.frozen
class SqliteUrl:
    """A SQLite database file."""

    path: Path

    def __str__(self) -> str:
        return f"sqlite:///{self.path}"


@attrs.frozen(repr=False)
class PostgresUrl:
    """A PostgreSQL database (a libpq connection URL; the password, if any, is never printed)."""

    url: str

    def __str__(self) -> str:
        """``postgresql://user[:***]@host[:port]/dbname``: what names the database, nothing else."""
        from psycopg.conninfo import conninfo_to_dict

        p = {k: str(v) for k, v in conninfo_to_dict(self.url).items()}
        user = p.get("user", "") + (":***" if p.get("password") else "")
        port = f":{p['port']}" if p.get("port") else ""
        return f"postgresql://{user}{'@' if user else ''}{p.get('host', '')}{port}/{p.get('dbname', '')}"

    __repr__ = __str__


Location = SqliteUrl | PostgresUrl
#: What every function here takes: a location, or a path (a SQLite file), or a URL.
Where = SqliteUrl | PostgresUrl | Path | str
SCHEMES = ("sqlite", "postgresql", "postgres")
MAX_URL = 4096


def location(value: Where) -> Location:
    """``sqlite:///PATH`` (relative; ``sqlite:////abs`` is absolute, as SQLAlchemy spells it), a
    :class:`~pathlib.Path`, or ``postgresql://`` / ``postgres://`` with libpq's URL syntax.
    Anything else is a :class:`ValueError` that says what is accepted."""
    if isinstance(value, SqliteUrl | PostgresUrl):
        return value
    if isinstance(value, Path):
        return SqliteUrl(value)
    if len(value) > MAX_URL or "\x00" in value:
        raise ValueError(f"DATABASE_URL is at most {MAX_URL} characters, without NUL")
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise ValueError("DATABASE_URL must be sqlite:///PATH or postgresql://[user[:password]@][host][:port]/dbname")
    if scheme == "sqlite":
        return _sqlite_url(rest)
    return _postgres_url(value)


def _sqlite_url(rest: str) -> SqliteUrl:
    if not rest.startswith("/") or rest == "/" or "?" in rest or "#" in rest:
        raise ValueError("a SQLite DATABASE_URL is sqlite:///PATH (sqlite:////PATH for an absolute path), no query")
    return SqliteUrl(Path(unquote(rest[1:])))


def _postgres_url(value: str) -> PostgresUrl:
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise ValueError(
            "DATABASE_URL names PostgreSQL, but psycopg is not installed: pip install 'ale-robotics[postgresql]'"
        ) from None
    import psycopg

    try:
        params = conninfo_to_dict(value)
    except (psycopg.Error, ValueError) as exc:  # ValueError: percent-escapes that are not UTF-8
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"DATABASE_URL is not a valid PostgreSQL URL: {_redact(detail, value)}") from None
    for port in str(params.get("port") or "").split(","):  # libpq checks it only when it connects
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError("DATABASE_URL's port must be a number from 1 to 65535")
    return PostgresUrl(value)


def _redact(text: str, url: str) -> str:
    """``text`` without the URL (libpq quotes it in some errors) or its password (given in its
    user part or as ``?password=``)."""
    text = text.replace(url, "<DATABASE_URL>")
    try:
        parts = urlsplit(url)
        found = [parts.password, *(v for k, v in parse_qsl(parts.query) if k == "password")]
    except ValueError:
        return text
    for password in {p for p in found if p}:
        text = text.replace(password, "***").replace(quote(password, safe=""), "***")
    return text


def default_location(data: Path) -> SqliteUrl:
    return SqliteUrl(data / "verifier.sqlite3")


# -- the two engines ---------------------------------------------------------------------------


class Session:
    """One connection, with the queries' ``?`` parameters in the driver's style."""

    def __init__(self, conn: Any, engine: SqliteEngine | PostgresEngine) -> None:
        self._conn, self._engine = conn, engine

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        for value in params:
            if isinstance(value, str) and "\x00" in value:
                raise Unstorable("a text with a NUL character cannot be stored")
        with _translated(self._engine):
            return self._conn.execute(self._engine.sql(sql), tuple(params))

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.execute(sql, params).fetchone()

    def script(self, sql: str) -> None:
        """Several statements, no parameters (migrations)."""
        with _translated(self._engine):
            self._engine.script(self._conn, sql)


#: sqlite3's primary result codes that mean "not usable now", not "your SQL is wrong":
#: BUSY, LOCKED, NOMEM, READONLY, IOERR, CORRUPT, FULL, CANTOPEN, PROTOCOL, NOTADB.
_SQLITE_UNAVAILABLE = frozenset({5, 6, 7, 8, 10, 11, 13, 14, 15, 26})
_SQLITE_BUSY = 5
#: How long a switch to WAL waits for the database's other connections (as long as the busy timeout).
_WAL_WAIT_S = 30.0


def _wal(conn: Any) -> None:
    """Put the database in WAL mode (kept in the file: once set, later switches are no-ops).

    The switch needs every other connection out of the file, and SQLite answers it "database is
    locked" at once, without calling the busy handler, while another connection holds the write
    lock (another ``ale-verify migrate`` in its transaction): so it is retried, with a growing
    pause, for as long as a busy lock is waited for."""
    deadline, pause = time.monotonic() + _WAL_WAIT_S, 0.002
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            busy = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == _SQLITE_BUSY
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


@attrs.define
class SqliteEngine:
    location: SqliteUrl
    #: Each thread's connection for :func:`connect`, kept between calls (see :meth:`kept`).
    _kept: threading.local = attrs.field(factory=threading.local, eq=False, repr=False)
    #: The writer (:func:`write`) keeps its connection between commits (see _Writer._connection).
    keeps_writer_connection = True

    def sql(self, sql: str) -> str:
        return sql

    def script(self, conn: Any, sql: str) -> None:
        for statement in _statements(sql):
            conn.execute(statement)

    @contextmanager
    def session(self, *, create: bool = False) -> Iterator[Any]:
        conn = self._open(create=create)
        try:
            yield conn
        finally:
            conn.close()

    def _open(self, *, create: bool = False) -> sqlite3.Connection:
        path = self.location.path
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        # mode=rw: a missing file is "unavailable", never silently a new empty database
        uri = f"file:{quote(str(path.absolute()))}?mode={'rwc' if create else 'rw'}"
        conn = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA foreign_keys = ON")
            # every commit is on disk when it returns (WAL's NORMAL would lose the last ones on power loss)
            conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def kept(self) -> Iterator[Any]:
        """This thread's connection, kept between calls while the path's file is the one it has
        open (a new connection opens the file and reads the schema again: nearly all of what a
        small query costs). One that anything failed on is closed: the next call opens another."""
        held = getattr(self._kept, "held", None)
        identity = self.identity()
        if held is not None and (held[1] != identity or held[2] != os.getpid()):
            self._drop_kept()
            held = None
        if held is None:
            held = self._kept.held = (self._open(), identity, os.getpid())
        try:
            yield held[0]
        except BaseException:
            self._drop_kept()
            raise
        if held[0].in_transaction:  # (autocommit: a caller's own BEGIN left open is not kept)
            self._drop_kept()

    def _drop_kept(self) -> None:
        held, self._kept.held = getattr(self._kept, "held", None), None
        if held is not None:
            with contextlib.suppress(Exception):
                held[0].close()

    def begin(self, conn: Any, lock: Sequence[str]) -> None:
        conn.execute("BEGIN IMMEDIATE")  # the database's write lock: it holds every table

    def identity(self) -> tuple[int, int] | None:
        """Which file is at the path now (a connection kept open follows a file moved away)."""
        try:
            st = self.location.path.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def migration_lock(self, conn: Any) -> None:
        _wal(conn)
        conn.execute("BEGIN IMMEDIATE")

    def translate(self, exc: BaseException) -> BaseException | None:
        if isinstance(exc, sqlite3.IntegrityError):
            return Refused(str(exc))
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(exc, sqlite3.Error) and code is not None and (code & 0xFF) in _SQLITE_UNAVAILABLE:
            return Unavailable(f"cannot use the database (SQLite at {self.location.path}): {exc}")
        return None

    def close(self) -> None:
        self._drop_kept()  # (this thread's; the others' go with the engine)


def _statements(script: str) -> Iterator[str]:
    """A SQLite script's statements (a trigger's BEGIN ... END is one), in order."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip():
        raise ValueError(f"an incomplete statement at the end of a migration: {pending.strip()[:80]!r}")


@attrs.define
class PostgresEngine:
    location: PostgresUrl
    _pool: psycopg_pool.ConnectionPool[Any] | None = None
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _translated: dict[str, str] = attrs.Factory(dict)
    #: The writer takes a pool connection per commit (the pool checks it: a server restarted
    #: between two commits costs none of them).
    keeps_writer_connection = False

    def sql(self, sql: str) -> str:
        found = self._translated.get(sql)
        if found is None:
            if "%" in sql:
                raise ValueError("a query with % is not portable here (psycopg reads it as a placeholder)")
            found = self._translated[sql] = sql.replace("?", "%s")
        return found

    def script(self, conn: Any, sql: str) -> None:
        conn.execute(sql)  # psycopg runs several statements when there are no parameters

    def _pool_for(self) -> psycopg_pool.ConnectionPool[Any]:
        with self._lock:
            if self._pool is None:
                from psycopg_pool import ConnectionPool

                self._pool = ConnectionPool(
                    self.location.url,
                    min_size=1,
                    max_size=POOL_MAX,
                    kwargs=_pg_options(),
                    check=ConnectionPool.check_connection,  # a connection the server dropped is replaced
                    timeout=WAIT_S,
                    name="ale-verify",
                    open=False,
                )
                self._pool.open(wait=False)
            return self._pool

    @contextmanager
    def session(self, *, create: bool = False) -> Iterator[Any]:
        if create:  # migrations: a connection of their own, so that a failure says why
            import psycopg

            with psycopg.connect(self.location.url, **_pg_options()) as conn:
                yield conn
            return
        with self._pool_for().connection() as conn:
            yield conn

    def identity(self) -> None:
        """(The server is the same whatever becomes of a connection: the pool checks them.)"""
        return None

    def kept(self) -> Any:
        """A pool connection (the pool keeps them)."""
        return self.session()

    def begin(self, conn: Any, lock: Sequence[str]) -> None:
        conn.execute("BEGIN")
        for table in lock:  # as SQLite's BEGIN IMMEDIATE: writers of these tables wait, readers do not
            conn.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")

    def migration_lock(self, conn: Any) -> None:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(4242001)")  # one migrating process at a time

    def translate(self, exc: BaseException) -> BaseException | None:
        import psycopg

        if isinstance(exc, psycopg.IntegrityError):
            return Refused(_first_line(exc))
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            reason = _redact(_first_line(exc), self.location.url)
            return Unavailable(f"cannot use the database (PostgreSQL at {self.location}): {reason}")
        return None

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=1)


def _pg_options() -> dict[str, Any]:
    return {"autocommit": True, "connect_timeout": max(2, int(WAIT_S)), "application_name": "ale-verify"}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_ENGINES: dict[Location, SqliteEngine | PostgresEngine] = {}
_WRITERS: dict[Location, _Writer] = {}
_ENGINES_LOCK = threading.Lock()


def engine(where: Where) -> SqliteEngine | PostgresEngine:
    """The process's engine for a database (PostgreSQL's holds its connection pool)."""
    loc = location(where)
    with _ENGINES_LOCK:
        found = _ENGINES.get(loc)
        if found is None:
            found = _ENGINES[loc] = SqliteEngine(loc) if isinstance(loc, SqliteUrl) else PostgresEngine(loc)
        return found


def close(where: Where | None = None) -> None:
    """Close one database's pool and writer, or every one (``None``); the next call opens them again
    (the writes waiting are committed first)."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values()) if where is None else [_ENGINES.pop(location(where), None)]
        writers = list(_WRITERS.values()) if where is None else [_WRITERS.pop(location(where), None)]
        if where is None:
            _ENGINES.clear()
            _WRITERS.clear()
    for writer in writers:
        if writer is not None:
            writer.stop()
    for found in engines:
        if found is not None:
            found.close()


@contextmanager
def _translated(found: SqliteEngine | PostgresEngine) -> Iterator[None]:
    try:
        yield
    except (Refused, Unavailable):
        raise
    except Exception as exc:
        mapped = found.translate(exc)
        if mapped is None:
            raise
        raise mapped from exc


@contextmanager
def connect(where: Where, *, create: bool = False, keep: bool = True) -> Iterator[Session]:
    """A session in autocommit mode: each statement is its own transaction (on the thread's kept
    connection, :meth:`SqliteEngine.kept`, unless it ``create`` the database or ``keep`` is
    False: then on a connection of its own, closed when it ends, as a batch job's reads are, so
    that nothing of it stays open in the database's files after it)."""
    found = engine(where)
    opened = found.session(create=True) if create else found.kept() if keep else found.session()
    with _translated(found), opened as conn:
        yield Session(conn, found)


@contextmanager
def transaction(where: Where, *, lock: Sequence[str] = ()) -> Iterator[Session]:
    """One write transaction, committed at the end (rolled back on any exception). ``lock``: the
    tables it reads before it writes, which no other writer may change meanwhile."""
    found = engine(where)
    with _translated(found), found.session() as conn:
        found.begin(conn, _ordered(lock))
        try:
            yield Session(conn, found)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _ordered(tables: Sequence[str] | set[str]) -> list[str]:
    """Tables to lock, in :data:`LOCK_ORDER` (a name not in it is the verifier's bug)."""
    unknown = set(tables) - set(LOCK_ORDER)
    if unknown:
        raise ValueError(f"not a table a transaction locks: {sorted(unknown)}")
    return [t for t in LOCK_ORDER if t in tables]


# -- group commit ------------------------------------------------------------------------------


def write(where: Where, unit: Callable[[Session], T], *, lock: Sequence[str] = ()) -> T:
    """Run ``unit`` in a write transaction and return what it returns once that transaction is
    committed (on disk: SQLite's ``synchronous = FULL``, PostgreSQL's ``synchronous_commit``).

    The transaction is shared: this process's writer thread gathers the units that wait (at most
    :data:`MAX_BATCH`), takes the union of their ``lock`` tables (as :func:`transaction` does) and
    runs them one after the other, each in a savepoint, then commits once. A unit sees the writes
    of the units before it, as if they had committed first; one that raises is rolled back alone
    and its caller gets the exception; when the commit fails (or the database is
    :class:`Unavailable` in the middle) every caller of that commit gets :class:`Unavailable` and
    nothing of theirs is stored. A unit must not call :func:`write` itself."""
    _ordered(lock)  # a wrong table name fails here, in its caller
    while True:
        loc = location(where)
        with _ENGINES_LOCK:
            writer = _WRITERS.get(loc)
            if writer is None or writer.pid != os.getpid():  # (a forked child: the thread is not there)
                writer = _WRITERS[loc] = _Writer(loc)
        future = writer.submit(unit, tuple(lock))
        if future is not None:
            break  # (None: that writer was being closed; the next one takes it)
    result: T = future.result()
    return result


@attrs.define(eq=False)
class _Unit:
    run: Callable[[Session], Any]
    lock: tuple[str, ...]
    future: Future[Any] = attrs.Factory(Future)


class _Writer:
    """The thread that commits one process's writes to one database together (:func:`write`)."""

    def __init__(self, where: Location) -> None:
        self.where = where
        self.pid = os.getpid()
        self._queue: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._held = contextlib.ExitStack()  # the writer's connection (_connection)
        self._conn: Any = None
        self._identity: Any = None  # the database file it has open (SqliteEngine.identity)
        self._thread = threading.Thread(target=self._run, name="ale-verify-db-writer", daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[Session], Any], lock: tuple[str, ...]) -> Future[Any] | None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a unit of db.write called db.write: it would wait for itself")
        unit = _Unit(run, lock)
        with self._lock:
            if self._closed:
                return None
            self._queue.put(unit)
        return unit.future

    def stop(self) -> None:
        """Commit what was submitted, then end the thread."""
        with self._lock:
            self._closed = True
            self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._drop()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, last = [first], False
            while len(batch) < MAX_BATCH:
                try:
                    unit = self._queue.get_nowait()
                except queue.Empty:
                    break
                if unit is None:
                    last = True
                    break
                batch.append(unit)
            self._commit(batch)
            if last:
                return

    def _commit(self, batch: list[_Unit]) -> None:
        """One transaction for the batch: each unit in a savepoint, one commit; then the callers."""
        done: list[tuple[bool, Any]] = []
        found = engine(self.where)
        try:
            with _translated(found):
                conn = self._connection(found)
                found.begin(conn, _ordered({t for unit in batch for t in unit.lock}))
                try:
                    s = Session(conn, found)
                    done.extend(_savepoint(s, unit) for unit in batch)
                except BaseException:
                    with contextlib.suppress(Exception):  # (SQLite may have rolled it back already)
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            if not found.keeps_writer_connection:
                self._drop()
        except BaseException as exc:  # nothing of the batch is stored: every caller is told
            self._drop()  # the next commit opens a new connection
            for unit in batch:  # (the thread goes on whatever it was: the next callers must be answered)
                unit.future.set_exception(_for_each(exc))
            return
        for unit, (ok, value) in zip(batch, done, strict=True):
            if ok:
                unit.future.set_result(value)
            else:
                unit.future.set_exception(value)

    def _connection(self, found: SqliteEngine | PostgresEngine) -> Any:
        """The writer's connection, kept between commits on SQLite: a connection closed after each
        commit would, as the database's last one, checkpoint the WAL into the database file each
        time (PostgreSQL's goes back to the pool after each commit)."""
        if self._conn is not None and found.identity() != self._identity:
            self._drop()  # the file was moved or replaced: the path's file is the database
        if self._conn is None:
            identity = found.identity()
            self._conn = self._held.enter_context(found.session())
            self._identity = identity
        return self._conn

    def _drop(self) -> None:
        self._conn = None
        with contextlib.suppress(Exception):
            self._held.close()
        self._held = contextlib.ExitStack()


def _savepoint(s: Session, unit: _Unit) -> tuple[bool, Any]:
    """Run one unit in a savepoint: (True, its result), or (False, what it raised), rolled back.
    :class:`Unavailable` ends the whole transaction (the database may have ended it already)."""
    s.execute("SAVEPOINT ale_unit")
    try:
        value = unit.run(s)
    except Unavailable:
        raise
    except Exception as exc:
        s.execute("ROLLBACK TO SAVEPOINT ale_unit")
        s.execute("RELEASE SAVEPOINT ale_unit")
        return False, exc
    s.execute("RELEASE SAVEPOINT ale_unit")
    return True, value


def _for_each(exc: BaseException) -> BaseException:
    """The batch's failure as each caller raises it (a new Unavailable each: callers raise it at once)."""
    if isinstance(exc, Unavailable):
        fresh = Unavailable(str(exc))
        fresh.__cause__ = exc.__cause__
        return fresh
    return exc


def exists(where: Where) -> bool:
    """Whether the database has been made (by :func:`migrate`); a server that cannot be
    reached is :class:`Unavailable`, not "no"."""
    loc = location(where)
    if isinstance(loc, SqliteUrl):
        return loc.path.is_file()
    with connect(loc, create=True) as s:
        return s.one("SELECT to_regclass('schema_migrations')")[0] is not None


def migrate(where: Where) -> int:
    """Create or upgrade the database; return its schema version. Processes that start at once
    on one database migrate one after the other (SQLite's write lock, a PostgreSQL advisory lock)."""
    found = engine(where)
    name = "sqlite" if isinstance(found, SqliteEngine) else "postgresql"
    with _translated(found), found.session(create=True) as conn:
        found.migration_lock(conn)
        s = Session(conn, found)
        try:
            real = "REAL" if name == "sqlite" else "DOUBLE PRECISION"
            s.execute(f"CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at {real})")
            done = {row[0] for row in s.execute("SELECT version FROM schema_migrations").fetchall()}
            for version, migration in enumerate(MIGRATIONS, start=1):
                if version not in done:
                    s.script(getattr(migration, name))
                    s.execute("INSERT INTO schema_migrations VALUES (?, ?)", [version, time.time()])
            _load_vocabulary(s)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return len(MIGRATIONS)


def _load_vocabulary(s: Session) -> None:
    """The reason codes and levels of ale.core.reasons, as the triggers of migration 2 read them.
    Codes are added and their uses updated, never removed (old rows keep theirs)."""
    for reason, info in REASONS.items():
        uses = ",".join(sorted(u.value for u in info.uses))
        s.execute(
            "INSERT INTO reason_codes (code, uses) VALUES (?, ?) ON CONFLICT (code) DO UPDATE SET uses = excluded.uses",
            [reason.value, uses],
        )
    for level in Level:
        s.execute("INSERT INTO levels (name) VALUES (?) ON CONFLICT (name) DO NOTHING", [level.value])


def _checked_notes(reasons: list[dict[str, Any]]) -> list[dict[str, str]]:
    notes = []
    for item in reasons:
        code = Reason(item["reason"])
        if not REASONS[code].uses & {Use.REJECTION, Use.NOTE} or not isinstance(item["message"], str):
            raise ValueError(f"{code} is not a rejection reason or a note")
        notes.append({"reason": code.value, "message": item["message"]})
    return notes


def _check_codes(row: dict[str, Any]) -> dict[str, Any]:
    """A submission row in the vocabulary's terms (a wrong code here is the verifier's bug)."""
    status, reason, level = row["status"], row["reason"], row["level"]
    if status == "rejected":
        if reason is None or Use.REJECTION not in REASONS[Reason(reason)].uses or level is not None:
            raise ValueError(f"a rejected submission needs a rejection reason and no level, not {reason!r}, {level!r}")
    elif status == "accepted":
        if reason is not None or level is None:
            raise ValueError("an accepted submission has a level and no reason")
        level = Level(level)
    else:
        raise ValueError(f"status is accepted or rejected, not {status!r}")
    return {
        **row,
        "reason": None if reason is None else Reason(reason).value,
        "level": None if level is None else Level(level).value,
        "reasons": _checked_notes(row["reasons"]),
    }


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _insert(s: Session, table: str, row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    s.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


# -- users and API tokens --------------------------------------------------------------------


def upsert_user(where: Where, user_id: str, display_name: str, source: str) -> None:
    with connect(where) as s:
        s.execute(
            "INSERT INTO users (id, display_name, source, created_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET display_name = excluded.display_name",
            [user_id, display_name, source, time.time()],
        )


def create_api_token(where: Where, user_id: str, label: str) -> str:
    """A new API token for the user; only its SHA-256 is stored."""
    token = "ale_" + secrets.token_urlsafe(32)
    with connect(where) as s:
        s.execute(
            "INSERT INTO api_tokens (token_sha256, user_id, label, created_at) VALUES (?, ?, ?, ?)",
            [_token_hash(token), user_id, label, time.time()],
        )
    return token


def user_for_token(where: Where, token: str) -> str | None:
    with connect(where) as s:
        row = s.one(
            "SELECT user_id FROM api_tokens WHERE token_sha256 = ? AND revoked_at IS NULL", [_token_hash(token)]
        )
    return row[0] if row else None


# -- rate limits -----------------------------------------------------------------------------


RATE_PRUNE = "DELETE FROM rate_events WHERE user_id = ? AND action = ? AND at < ?"


def take_rate(where: Where, user_id: str, action: str, per_hour: int) -> bool:
    """Record one ``action`` unless the user already did ``per_hour`` of them in the last hour.
    Exact under concurrency: the count and the record are one transaction holding ``rate_events``
    against other writers (of this process's shared commit, the takes before it are counted).
    Only this user's records of this action older than the hour are deleted, through the index
    (every upload deleting everyone's stale records scanned the whole table); so the table holds
    at most ``per_hour`` records of each user and action."""
    now = time.time()

    def take(s: Session) -> bool:
        s.execute(RATE_PRUNE, [user_id, action, now - 3600])
        (count,) = s.one(
            "SELECT COUNT(*) FROM rate_events WHERE user_id = ? AND action = ? AND at >= ?",
            [user_id, action, now - 3600],
        )
        if count >= per_hour:
            return False
        s.execute("INSERT INTO rate_events VALUES (?, ?, ?)", [user_id, action, now])
        return True

    return write(where, take, lock=["rate_events"])


# -- challenges ------------------------------------------------------------------------------


def create_challenge(where: Where, user_id: str, ttl_s: int) -> dict[str, Any]:
    now = time.time()
    challenge = {
        "id": "chl_" + secrets.token_hex(12),
        "user_id": user_id,
        "nonce": secrets.token_hex(32),
        "issued_at": now,
        "expires_at": now + ttl_s,
    }
    write(where, lambda s: _insert(s, "challenges", challenge))
    return challenge


def get_challenge(where: Where, challenge_id: str) -> dict[str, Any] | None:
    with connect(where) as s:
        rows = s.rows("SELECT * FROM challenges WHERE id = ?", [challenge_id])
    return rows[0] if rows else None


def challenge_unused(where: Where, challenge_id: str) -> bool:
    """Whether the challenge is still unused (a read: its use is stored with the verdict that
    uses it, :func:`insert_submission`)."""
    with connect(where) as s:
        return s.one("SELECT 1 FROM challenges WHERE id = ? AND used_at IS NULL", [challenge_id]) is not None


def _consume(s: Session, challenge_id: str, submission_id: str, now: float) -> bool:
    """Mark a challenge used, exactly once: concurrent uploads race here and one wins (one
    conditional UPDATE: SQLite's write lock, PostgreSQL's lock on ``challenges``)."""
    cur = s.execute(
        "UPDATE challenges SET used_at = ?, used_by_submission = ? WHERE id = ? AND used_at IS NULL",
        [now, submission_id, challenge_id],
    )
    return bool(cur.rowcount == 1)


# -- submissions and the audit log -----------------------------------------------------------


#: How a submission's summary and notes are brought up to date (re-scored) when its judgements
#: change: (summary, notes, scoring input or None, the tasks and what changed for each) -> (summary,
#: notes, the audit entry's reason). ale_verify.judging provides them; only SQL is here.
Rescore = Callable[[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None, dict[str, Any]],
                   tuple[dict[str, Any], list[dict[str, Any]], str]]  # fmt: skip


@attrs.frozen
class Queued:
    """What an accepted upload leaves behind besides its row: the verifier's judge jobs (rows of
    ``judge_jobs`` without the submission id), its scoring input (``release_sha256``, ``results``),
    the registered judge keys its credited verdicts rest on ((task, key id) pairs), and how to
    re-score it should one of those keys have been revoked while it was being checked."""

    jobs: tuple[dict[str, Any], ...] = ()
    scoring: dict[str, Any] | None = None
    key_credits: tuple[tuple[str, str], ...] = ()
    on_revoked: Rescore | None = None


#: A verdict to store: a submission row, its audit entry and what it leaves (:func:`insert_submission`).
Verdict = tuple[dict[str, Any], dict[str, Any], Queued | None]


def insert_submission(
    where: Where,
    row: dict[str, Any],
    audit: dict[str, Any],
    queued: Queued | None = None,
    *,
    challenge: str | None = None,
    replayed: Verdict | None = None,
) -> bool:
    """Store a submission and its first audit entry; codes and levels must be the vocabulary's.
    With ``queued``, in the same transaction, what it leaves for later (:class:`Queued`). With
    ``challenge``, in the same transaction, the challenge's use by this submission: when another
    submission used it first, ``replayed`` (the verdict saying so) is stored instead, or, without
    it, the row as it is, with no use. True when ``row`` was stored, False for ``replayed``."""
    first = (*_verdict(row, audit), queued)
    instead = None if replayed is None else (*_verdict(replayed[0], replayed[1]), replayed[2])

    def store(s: Session) -> bool:
        used = challenge is None or _consume(s, challenge, row["id"], audit["at"])
        if not used and instead is not None:
            _store(s, *instead)
            return False
        _store(s, *first)
        return True

    return write(where, store, lock=["challenges"] if challenge is not None else [])


def _verdict(row: dict[str, Any], audit: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rows to insert (checked, encoded: before the shared transaction, not in it)."""
    row = _check_codes(row)
    row = {**row, "reasons": json.dumps(row["reasons"]), "summary": json.dumps(row["summary"], sort_keys=True)}
    audit = {**audit, "to_level": None if audit["to_level"] is None else Level(audit["to_level"]).value}
    return row, {**audit, "submission_id": row["id"]}


def _store(s: Session, row: dict[str, Any], audit: dict[str, Any], queued: Queued | None) -> None:
    _insert(s, "submissions", row)
    _insert(s, "audit_log", audit)
    if queued is not None:
        _insert_queued(s, row["id"], queued, now=audit["at"])


def _insert_queued(s: Session, submission_id: str, queued: Queued, *, now: float) -> None:
    for job in queued.jobs:
        _insert(s, "judge_jobs", {**job, "submission_id": submission_id})
    if queued.scoring is not None:
        _insert(s, "scoring_inputs", {**queued.scoring, "submission_id": submission_id})
    for task, key_id in queued.key_credits:
        _insert(s, "judge_credits", {"submission_id": submission_id, "task": task, "key_id": key_id})
    if not queued.key_credits or queued.on_revoked is None:
        return
    # A key revoked while this upload was checked: its revocation did not see these credits (they
    # were not committed), so they are undone here, as the revocation undoes the ones it finds.
    ids = sorted({key_id for _, key_id in queued.key_credits})
    revoked = s.rows(
        f"SELECT * FROM judge_keys WHERE revoked_at IS NOT NULL AND key_id IN ({', '.join('?' * len(ids))})", ids
    )
    if revoked:
        _rescore(s, submission_id, {r["key_id"]: r for r in revoked}, queued.on_revoked, now=now)


def _update_submission(s: Session, submission_id: str, summary: dict[str, Any], reasons: list[dict[str, Any]]) -> None:
    s.execute(
        "UPDATE submissions SET summary = ?, reasons = ? WHERE id = ?",
        [json.dumps(summary, sort_keys=True), json.dumps(_checked_notes(reasons)), submission_id],
    )


def _scoring_input(s: Session, submission_id: str) -> dict[str, Any] | None:
    rows = s.rows("SELECT release_sha256, results FROM scoring_inputs WHERE submission_id = ?", [submission_id])
    return rows[0] if rows else None


def _apply(s: Session, submission_id: str, changes: dict[str, Any], apply: Rescore, *, action: str, now: float) -> None:
    """Re-score one submission with ``apply`` and log it (its level is unchanged: from = to)."""
    (sub,) = s.rows("SELECT level, summary, reasons FROM submissions WHERE id = ?", [submission_id])
    summary, reasons, message = apply(
        json.loads(sub["summary"]), json.loads(sub["reasons"]), _scoring_input(s, submission_id), changes
    )
    _update_submission(s, submission_id, summary, reasons)
    entry = {"submission_id": submission_id, "at": now, "actor": "verifier", "action": action,
             "from_level": sub["level"], "to_level": sub["level"], "reason": message}  # fmt: skip
    _insert(s, "audit_log", entry)


def _rescore(s: Session, submission_id: str, revoked: dict[str, dict[str, Any]], apply: Rescore, *, now: float) -> None:
    """The submission's tasks credited to one of the ``revoked`` keys (key id -> row), re-scored."""
    credits = s.rows("SELECT task, key_id FROM judge_credits WHERE submission_id = ? ORDER BY task", [submission_id])
    changes = {c["task"]: revoked[c["key_id"]] for c in credits if c["key_id"] in revoked}
    if changes:
        _apply(s, submission_id, changes, apply, action="rescored", now=now)


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "reasons": json.loads(row["reasons"]), "summary": json.loads(row["summary"])}


def get_submission(where: Where, submission_id: str) -> dict[str, Any] | None:
    with connect(where) as s:
        rows = s.rows("SELECT * FROM submissions WHERE id = ?", [submission_id])
        if not rows:
            return None
        history = s.rows("SELECT * FROM audit_log WHERE submission_id = ? ORDER BY seq", [submission_id])
    return {**_decode(rows[0]), "history": history}


def change_marker(where: Where) -> tuple[int, int]:
    """What changes whenever an upload or a level change commits: the number of submissions and
    the last audit entry's sequence number (for watching a database that is not a file)."""
    with connect(where) as s:
        (row,) = s.rows(
            "SELECT (SELECT count(*) FROM submissions) AS submissions, "
            "(SELECT coalesce(max(seq), 0) FROM audit_log) AS audit"
        )
    return int(row["submissions"]), int(row["audit"])


def ranked_submissions(where: Where) -> list[dict[str, Any]]:
    """Accepted, not revoked, for the leaderboard (the export also shows revoked rows, marked)."""
    with connect(where) as s:
        rows = s.rows("SELECT * FROM submissions WHERE status = 'accepted' ORDER BY received_at, id")
    return [_decode(r) for r in rows]


def all_submissions(where: Where) -> list[dict[str, Any]]:
    with connect(where) as s:
        rows = s.rows("SELECT * FROM submissions ORDER BY received_at, id")
        history = s.rows("SELECT * FROM audit_log ORDER BY seq")
    by_id: dict[str, list[dict[str, Any]]] = {}
    for h in history:
        by_id.setdefault(h["submission_id"], []).append(h)
    return [{**_decode(r), "history": by_id.get(r["id"], [])} for r in rows]


def change_level(
    where: Where,
    submission_id: str,
    *,
    actor: str,
    action: str,
    to_level: str,
    reason: str,
    allowed_from: tuple[str, ...],
) -> dict[str, Any]:
    """Move an accepted submission to ``to_level`` (audit, revoke), logging it in the audit log."""
    to_level = Level(to_level).value
    with transaction(where, lock=["submissions"]) as s:
        row = s.one("SELECT status, level FROM submissions WHERE id = ?", [submission_id])
        if row is None:
            raise KeyError(submission_id)
        status, level = row
        if status != "accepted" or level not in allowed_from:
            raise Conflict(f"a {status} submission at level {level} cannot be moved to {to_level}")
        s.execute("UPDATE submissions SET level = ? WHERE id = ?", [to_level, submission_id])
        _insert(
            s,
            "audit_log",
            {
                "submission_id": submission_id,
                "at": time.time(),
                "actor": actor,
                "action": action,
                "from_level": level,
                "to_level": to_level,
                "reason": reason,
            },
        )
    result = get_submission(where, submission_id)
    assert result is not None
    return result


# -- runner keys -----------------------------------------------------------------------------


def register_runner_key(where: Where, *, key_id: str, public_key: str, kind: str, label: str, actor: str) -> None:
    row = {
        "key_id": key_id,
        "public_key": public_key,
        "kind": kind,
        "label": label,
        "registered_at": time.time(),
        "registered_by": actor,
        "retired_at": None,
    }
    try:
        with connect(where) as s:
            _insert(s, "runner_keys", row)
    except Refused:
        raise Conflict("this runner key is already registered") from None


def retire_runner_key(where: Where, key_id: str) -> None:
    with connect(where) as s:
        cur = s.execute(
            "UPDATE runner_keys SET retired_at = ? WHERE key_id = ? AND retired_at IS NULL", [time.time(), key_id]
        )
        if cur.rowcount != 1:
            raise KeyError(key_id)


def runner_key(where: Where, key_id: str) -> dict[str, Any] | None:
    with connect(where) as s:
        rows = s.rows("SELECT * FROM runner_keys WHERE key_id = ?", [key_id])
    return rows[0] if rows else None


def runner_keys(where: Where) -> list[dict[str, Any]]:
    with connect(where) as s:
        return s.rows("SELECT * FROM runner_keys ORDER BY registered_at, key_id")


# -- judge keys (docs/verifier.md, "Faithfulness") --------------------------------------------

#: The audit log's ``submission_id`` of a judge key's own entries: ``judge-key:<key id>``.
JUDGE_KEY_SUBJECT = "judge-key:"


def _key_entry(s: Session, key_id: str, *, actor: str, action: str, reason: str, now: float) -> None:
    _insert(s, "audit_log", {"submission_id": JUDGE_KEY_SUBJECT + key_id, "at": now, "actor": actor,
                             "action": action, "from_level": None, "to_level": None, "reason": reason})  # fmt: skip


def register_judge_key(where: Where, *, key_id: str, public_key: str, label: str, actor: str) -> dict[str, Any]:
    """A judge key whose signed verdicts are credited from now on, with its audit entry; a key
    already registered, active or revoked, is a :class:`Conflict` (a revoked key stays revoked)."""
    now = time.time()
    row = {"key_id": key_id, "public_key": public_key, "label": label, "source": "api", "registered_at": now,
           "registered_by": actor, "revoked_at": None, "revoked_by": None, "revoke_reason": None}  # fmt: skip
    try:
        with transaction(where) as s:
            _insert(s, "judge_keys", row)
            _key_entry(s, key_id, actor=actor, action="judge_key_registered", reason=label, now=now)
    except Refused:
        raise Conflict("this judge key is already registered here (a revoked key cannot be registered again)") from None
    return row


def judge_key(where: Where, key_id: str) -> dict[str, Any] | None:
    with connect(where) as s:
        rows = s.rows("SELECT * FROM judge_keys WHERE key_id = ?", [key_id])
    return rows[0] if rows else None


def judge_keys(where: Where) -> list[dict[str, Any]]:
    with connect(where) as s:
        return s.rows("SELECT * FROM judge_keys ORDER BY registered_at, key_id")


def revoke_judge_key(
    where: Where,
    key_id: str,
    *,
    actor: str,
    reason: str,
    configured: dict[str, str] | None,
    rescore: Rescore,
) -> tuple[dict[str, Any], list[str]]:
    """Revoke a judge key (one registered here, or ``configured``: one of the configuration's,
    ``{"public_key", "label"}``, recorded revoked) and re-score, in the same transaction, every
    submission with a task credited to it; (the key's row, those submissions' ids). An unknown key
    is a KeyError, a revoked one a :class:`Conflict`."""
    now = time.time()
    with transaction(where, lock=["judge_keys", "submissions"]) as s:
        rows = s.rows("SELECT * FROM judge_keys WHERE key_id = ?", [key_id])
        if rows and rows[0]["revoked_at"] is not None:
            raise Conflict("this judge key is already revoked")
        if rows:
            s.execute(
                "UPDATE judge_keys SET revoked_at = ?, revoked_by = ?, revoke_reason = ? WHERE key_id = ?",
                [now, actor, reason, key_id],
            )
        elif configured is not None:
            _insert(s, "judge_keys", {"key_id": key_id, "public_key": configured["public_key"],
                                      "label": configured["label"], "source": "configuration", "registered_at": now,
                                      "registered_by": "configuration", "revoked_at": now, "revoked_by": actor,
                                      "revoke_reason": reason})  # fmt: skip
        else:
            raise KeyError(key_id)
        _key_entry(s, key_id, actor=actor, action="judge_key_revoked", reason=reason, now=now)
        (key,) = s.rows("SELECT * FROM judge_keys WHERE key_id = ?", [key_id])
        credited = s.rows(
            "SELECT DISTINCT submission_id FROM judge_credits WHERE key_id = ? ORDER BY submission_id", [key_id]
        )
        affected = [r["submission_id"] for r in credited]
        for submission_id in affected:
            _rescore(s, submission_id, {key_id: key}, rescore, now=now)
    return key, affected


# -- the verifier's judge jobs -----------------------------------------------------------------

_DUE = "(state = 'pending' AND not_before <= ?) OR (state = 'running' AND lease_until < ?)"


def judge_job_due(where: Where, now: float) -> bool:
    """Whether a job can be claimed now (a read, no lock: the claim itself decides)."""
    with connect(where) as s:
        return s.one(f"SELECT 1 FROM judge_jobs WHERE {_DUE} LIMIT 1", [now, now]) is not None


def claim_judge_job(where: Where, *, worker: str, now: float, lease_s: float) -> dict[str, Any] | None:
    """Claim the next due job for ``worker`` until ``now + lease_s`` (a pending one whose time has
    come, or a running one whose lease ran out: its worker stopped), counting the attempt. Claims
    hold ``judge_jobs`` against other writers (SQLite's write lock, PostgreSQL's table lock), so of
    any number of processes exactly one gets each job."""
    with transaction(where, lock=["judge_jobs"]) as s:
        rows = s.rows(
            f"SELECT * FROM judge_jobs WHERE {_DUE} ORDER BY not_before, queued_at, submission_id, task LIMIT 1",
            [now, now],
        )
        if not rows:
            return None
        job = rows[0]
        s.execute(
            "UPDATE judge_jobs SET state = 'running', claimed_by = ?, lease_until = ?, attempts = attempts + 1 "
            "WHERE submission_id = ? AND task = ?",
            [worker, now + lease_s, job["submission_id"], job["task"]],
        )
    return {**job, "state": "running", "claimed_by": worker, "lease_until": now + lease_s,
            "attempts": job["attempts"] + 1}  # fmt: skip


_MINE = "submission_id = ? AND task = ? AND state = 'running' AND claimed_by = ?"


def renew_judge_job(where: Where, submission_id: str, task: str, *, worker: str, until: float) -> bool:
    """Extend the worker's lease; False when the job is no longer its own."""
    with connect(where) as s:
        cur = s.execute(f"UPDATE judge_jobs SET lease_until = ? WHERE {_MINE}", [until, submission_id, task, worker])
        return bool(cur.rowcount == 1)


def retry_judge_job(
    where: Where, submission_id: str, task: str, *, worker: str, not_before: float, outcome: str, error: str
) -> None:
    """Give the job back, to be tried again from ``not_before`` (a judge that did not answer)."""
    with connect(where) as s:
        cur = s.execute(
            "UPDATE judge_jobs SET state = 'pending', lease_until = NULL, not_before = ?, outcome = ?, last_error = ? "
            f"WHERE {_MINE}",
            [not_before, outcome, error, submission_id, task, worker],
        )
        if cur.rowcount != 1:
            raise Conflict("the judge job is no longer this worker's")


def finish_judge_job(
    where: Where,
    submission_id: str,
    task: str,
    *,
    worker: str,
    state: str,
    outcome: str,
    error: str | None,
    change: Any,
    apply: Rescore,
) -> None:
    """End the job (``done``: judged; ``failed``: no verdict) and, in the same transaction,
    re-score its submission with ``apply`` (``change``: what the judge gave for the task); the
    stored judge input is dropped. A job that is no longer the worker's is a :class:`Conflict`."""
    now = time.time()
    # submissions first, as an upload's transaction writes them (then its jobs): one lock order, no deadlock
    with transaction(where, lock=["submissions", "judge_jobs"]) as s:
        cur = s.execute(
            "UPDATE judge_jobs SET state = ?, outcome = ?, last_error = ?, judge_input = NULL, finished_at = ?, "
            f"lease_until = NULL WHERE {_MINE}",
            [state, outcome, error, now, submission_id, task, worker],
        )
        if cur.rowcount != 1:
            raise Conflict("the judge job is no longer this worker's")
        _apply(s, submission_id, {task: change}, apply, action="judged", now=now)


def judge_jobs(where: Where, submission_id: str | None = None) -> list[dict[str, Any]]:
    """The judge jobs (of one submission), without their inputs."""
    where_clause, params = ("WHERE submission_id = ? ", [submission_id]) if submission_id else ("", [])
    with connect(where) as s:
        order = "ORDER BY queued_at, submission_id, task"
        return s.rows(f"SELECT {_JOB_COLUMNS} FROM judge_jobs {where_clause}{order}", params)


#: What a judge job's listing shows of it (not its input: whether it still holds one).
_JOB_COLUMNS = ("submission_id, task, state, input_sha256, attempts, not_before, claimed_by, lease_until, outcome, "
                "last_error, queued_at, finished_at, judge_input IS NOT NULL AS has_input")  # fmt: skip
#: A judge job's states, in the order the operator listing counts them.
JUDGE_JOB_STATES = ("pending", "running", "failed", "done")
#: The listing's page: jobs by default, at most, and the largest offset (docs/verifier.md, "Judge jobs").
JOB_PAGE_DEFAULT, JOB_PAGE_MAX, JOB_OFFSET_MAX = 50, 500, 10**9


def judge_job_page(where: Where, *, state: str | None, limit: int, offset: int) -> dict[str, Any]:
    """The operator's view of the judge jobs: the count in each state, the oldest pending job's
    ``queued_at``, and one page (``limit`` from ``offset``, in queue order) of the jobs in
    ``state`` (all without), without their inputs; ``total`` is how many the filter matches."""
    where_clause, params = ("WHERE state = ? ", [state]) if state else ("", [])
    with connect(where) as s:
        counts = {r["state"]: int(r["n"]) for r in s.rows("SELECT state, count(*) AS n FROM judge_jobs GROUP BY state")}
        oldest = s.one("SELECT min(queued_at) FROM judge_jobs WHERE state = 'pending'")[0]
        jobs = s.rows(
            f"SELECT {_JOB_COLUMNS} FROM judge_jobs {where_clause}ORDER BY queued_at, submission_id, task "
            "LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
    by_state = {name: counts.get(name, 0) for name in JUDGE_JOB_STATES}
    return {
        "counts": by_state,
        "oldest_pending_queued_at": None if oldest is None else float(oldest),
        "total": by_state[state] if state else sum(by_state.values()),
        "jobs": [{**job, "has_input": bool(job["has_input"])} for job in jobs],
    }
