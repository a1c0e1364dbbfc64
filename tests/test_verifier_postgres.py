"""The verifier on both database engines: the two schemas agree, each database refuses the same
rows (the append-only audit log included), two ``ale-verify serve`` processes on one database
accept a challenge token exactly once, and a bad or vanished database is one clear answer.

Every verifier test module runs on SQLite and on PostgreSQL (conftest.py's ``db_engine``); the
tests here are the ones about the engines themselves.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import site_fixtures as sf
import verifier_helpers as h
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from pg_cluster import Cluster, Databases

from ale_verify import db, export
from ale_verify.config import Settings


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


def _url(database: Path | str) -> str:
    """DATABASE_URL for a test database."""
    return f"sqlite:///{database}" if isinstance(database, Path) else database


def _migrated(db_engine: Databases, tmp: Path) -> Path | str:
    database = db_engine.new(tmp)
    db.migrate(database)
    return database


# -- the two schemas ------------------------------------------------------------------------------

_TYPES = {"text": "text", "real": "float", "double precision": "float", "integer": "int", "bigint": "int"}
_TRIGGER = re.compile(r"CREATE TRIGGER (\w+)\s+(BEFORE|AFTER)\s+(.+?)\s+ON\s+(?:public\.)?(\w+)", re.DOTALL)


def _trigger(sql: str) -> tuple[str, str, str, str]:
    found = _TRIGGER.match(sql.strip())
    assert found, sql
    name, timing, event, table = found.groups()
    return name, timing, " ".join(event.split()), table


def _sqlite_schema(path: Path) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    with h.raw_connect(path) as conn:
        q = conn.execute
        tables = [r[0] for r in q("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        for t in tables:
            # a SQLite PRIMARY KEY that is not an INTEGER one allows NULL (a legacy quirk); the
            # verifier never writes one, and PostgreSQL's implies NOT NULL: read both as NOT NULL
            columns = [
                (n, _TYPES[ty.lower()], bool(nn or pk), bool(pk))
                for _, n, ty, nn, _, pk in q(f"PRAGMA table_info({t})")
            ]
            fks = sorted((r[3], r[2], r[4]) for r in q(f"PRAGMA foreign_key_list({t})"))
            unique, indexes = [], []
            for _, name, is_unique, origin, _ in q(f"PRAGMA index_list({t})"):
                cols = tuple(r[2] for r in q(f"PRAGMA index_info({name})"))
                if origin == "c":
                    indexes.append((name, cols))
                elif is_unique:
                    unique.append(cols)
            if any(pk for *_, pk in columns) and not any(c == tuple(n for n, *_, pk in columns if pk) for c in unique):
                unique.append(tuple(n for n, *_, pk in columns if pk))  # an INTEGER PRIMARY KEY has no index
            schema[t] = {"columns": columns, "foreign_keys": fks, "unique": sorted(unique), "indexes": sorted(indexes)}
        schema["triggers"] = sorted(_trigger(r[0]) for r in q("SELECT sql FROM sqlite_master WHERE type = 'trigger'"))
    return schema


def _postgres_schema(url: str) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    with h.raw_connect(url) as conn:
        q = conn.execute
        tables = [r[0] for r in q("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for t in tables:
            pk = {r[0] for r in q(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary", [t])}  # fmt: skip
            columns = [(n, _TYPES[ty], nullable == "NO", n in pk) for n, ty, nullable in q(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position", [t])]  # fmt: skip
            constraints = q(
                "SELECT c.contype, (SELECT array_agg(a.attname ORDER BY k.ord) FROM unnest(c.conkey) "
                "WITH ORDINALITY AS k(num, ord) JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.num), "
                "c.confrelid::regclass::text, (SELECT array_agg(a.attname) FROM unnest(c.confkey) AS k(num) "
                "JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.num) "
                "FROM pg_constraint c WHERE c.conrelid = %s::regclass",
                [t],
            ).fetchall()
            fks = sorted((cols[0], ref, refcols[0]) for kind, cols, ref, refcols in constraints if kind == "f")
            unique = sorted(tuple(cols) for kind, cols, _, _ in constraints if kind in ("p", "u"))
            indexes = sorted((name, tuple(re.findall(r"\((.*)\)", d)[0].replace(" ", "").split(","))) for name, d in q(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = %s "
                "AND indexname NOT IN (SELECT conname FROM pg_constraint)", [t]))  # fmt: skip
            schema[t] = {"columns": columns, "foreign_keys": fks, "unique": unique, "indexes": indexes}
        schema["triggers"] = sorted(_trigger(r[0]) for r in q(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal"))  # fmt: skip
    return schema


def test_both_engines_schemas_agree(tmp_path: Path, pg_cluster: Cluster) -> None:
    """The same tables, columns (name, type, NOT NULL, primary key, in order), foreign keys,
    unique keys, indexes and triggers (name, timing, event, table) after the same migrations;
    PostgreSQL has one trigger more: TRUNCATE, which SQLite does not have, is refused too."""
    sqlite = tmp_path / "v.sqlite3"
    postgres = pg_cluster.new_database("schema")
    assert db.migrate(sqlite) == db.migrate(postgres) == len(db.MIGRATIONS)
    a, b = _sqlite_schema(sqlite), _postgres_schema(postgres)
    triggers_a, triggers_b = a.pop("triggers"), b.pop("triggers")
    assert a == b
    assert sorted(a) == ["api_tokens", "audit_log", "challenges", "judge_credits", "judge_jobs", "judge_keys",
                         "levels", "rate_events", "reason_codes", "runner_keys", "schema_migrations",
                         "scoring_inputs", "submissions", "users"]  # fmt: skip
    assert sorted([*triggers_a, ("audit_log_no_truncate", "BEFORE", "TRUNCATE", "audit_log")]) == triggers_b
    assert ("audit_log_no_update", "BEFORE", "UPDATE", "audit_log") in triggers_a
    assert ("audit_log_no_delete", "BEFORE", "DELETE", "audit_log") in triggers_a
    with h.raw_connect(sqlite) as x, h.raw_connect(postgres) as y:
        query = "SELECT version FROM schema_migrations ORDER BY version"
        assert [r[0] for r in x.execute(query)] == [r[0] for r in y.execute(query)] == [1, 2, 3]
        query = "SELECT code, uses FROM reason_codes ORDER BY code"
        assert x.execute(query).fetchall() == [tuple(r) for r in y.execute(query).fetchall()]


# -- each database refuses the same rows ----------------------------------------------------------

_SUB = "INSERT INTO submissions VALUES (?, 'u', 1.0, 'x', ?, ?, ?, ?, NULL, '{}')"
_AUDIT = "INSERT INTO audit_log (submission_id, at, actor, action, from_level, to_level, reason) VALUES "
_JOB = ("INSERT INTO judge_jobs (submission_id, task, state, input_sha256, attempts, not_before, queued_at) "
        "VALUES (?, ?, ?, 'd', 0, 0, 0)")  # fmt: skip
REFUSED = {
    "unknown-status": (_SUB, ["s9", "pending", None, None, "[]"]),
    "unknown-level-check": (_SUB, ["s9", "accepted", "gold", None, "[]"]),
    "unknown-reason": (_SUB, ["s9", "rejected", None, "made_up", "[]"]),
    "request-code-as-reason": (_SUB, ["s9", "rejected", None, "rate_limited", "[]"]),
    "unknown-listed-reason": (_SUB, ["s9", "accepted", "validated", None, '[{"reason": "made_up", "message": ""}]']),
    "unknown-level-change": ("UPDATE submissions SET level = 'gold' WHERE id = 's1'", []),
    "audit-unknown-level": (_AUDIT + "('s1', 0, 'a', 'b', NULL, 'gold', 'r')", []),
    "audit-update": ("UPDATE audit_log SET reason = 'nothing happened'", []),
    "audit-delete": ("DELETE FROM audit_log", []),
    "duplicate-nonce": ("INSERT INTO challenges VALUES ('c2', 'u', 'n1', 0, 1, NULL, NULL)", []),
    "unknown-user": ("INSERT INTO api_tokens VALUES ('h', 'nobody', 'l', 0, NULL)", []),
    "missing-display-name": ("INSERT INTO users (id, source, created_at) VALUES ('v', 'local', 0)", []),
    "unknown-runner-kind": ("INSERT INTO runner_keys VALUES ('k2', 'p2', 'friend', 'l', 0, 'op', NULL)", []),
    "duplicate-public-key": ("INSERT INTO runner_keys VALUES ('k2', 'p1', 'benchmark_team', 'l', 0, 'op', NULL)", []),
    "duplicate-submission": (_SUB, ["s1", "accepted", "validated", None, "[]"]),
    # migration 3
    "unknown-judge-key-source": (
        "INSERT INTO judge_keys VALUES ('j2', 'q2', 'l', 'friend', 0, 'op', NULL, NULL, NULL)",
        [],
    ),
    "duplicate-judge-public-key": (
        "INSERT INTO judge_keys VALUES ('j2', 'q1', 'l', 'api', 0, 'op', NULL, NULL, NULL)",
        [],
    ),
    "duplicate-judge-key-id": ("INSERT INTO judge_keys VALUES ('j1', 'q2', 'l', 'api', 0, 'op', NULL, NULL, NULL)", []),
    "unknown-job-state": (_JOB, ["s1", "t2", "stuck"]),
    "job-of-no-submission": (_JOB, ["s9", "t2", "pending"]),
    "duplicate-job": (_JOB, ["s1", "t1", "pending"]),
    "scoring-of-no-submission": ("INSERT INTO scoring_inputs VALUES ('s9', 'r', '{}')", []),
    "duplicate-scoring": ("INSERT INTO scoring_inputs VALUES ('s1', 'r', '{}')", []),
    "credit-of-no-submission": ("INSERT INTO judge_credits VALUES ('s9', 't', 'j1')", []),
    "duplicate-credit": ("INSERT INTO judge_credits VALUES ('s1', 't1', 'j2')", []),
    "job-without-attempts": (
        "INSERT INTO judge_jobs (submission_id, task, state, input_sha256, not_before, queued_at) "
        "VALUES ('s1', 't3', 'pending', 'd', 0, 0)",
        [],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_each_engine_refuses_the_same_rows(db_engine: Databases, tmp_path: Path, case: str) -> None:
    """Each constraint and trigger of the migrations, on each engine, through the one set of queries."""
    database = _migrated(db_engine, tmp_path)
    with db.connect(database) as s:
        s.execute("INSERT INTO users VALUES ('u', 'u', 'local', 0)")
        s.execute(_SUB, ["s1", "accepted", "validated", None, "[]"])
        s.execute(_AUDIT + "('s1', 0, 'verifier', 'accepted', NULL, 'validated', 'ok')")
        s.execute("INSERT INTO challenges VALUES ('c1', 'u', 'n1', 0, 1, NULL, NULL)")
        s.execute("INSERT INTO runner_keys VALUES ('k1', 'p1', 'benchmark_team', 'l', 0, 'op', NULL)")
        s.execute("INSERT INTO judge_keys VALUES ('j1', 'q1', 'l', 'api', 0, 'op', NULL, NULL, NULL)")
        s.execute(_JOB, ["s1", "t1", "pending"])
        s.execute("INSERT INTO scoring_inputs VALUES ('s1', 'r', '{}')")
        s.execute("INSERT INTO judge_credits VALUES ('s1', 't1', 'j1')")
    dump = h.dump(database)
    sql, params = REFUSED[case]
    with db.connect(database) as s, pytest.raises(db.Refused):
        s.execute(sql, params)
    assert h.dump(database) == dump  # nothing changed


def test_audit_log_refuses_truncate_on_postgresql(pg_cluster: Cluster) -> None:
    """TRUNCATE skips row triggers; the audit log has a statement trigger for it (SQLite has no TRUNCATE)."""
    database = pg_cluster.new_database("trunc")
    db.migrate(database)
    with h.raw_connect(database) as conn:
        conn.execute(_AUDIT.replace("?", "%s") + "('s', 0, 'a', 'b', NULL, NULL, 'r')")
        with pytest.raises(h.driver_errors(), match="append-only"):
            conn.execute("TRUNCATE audit_log")
        assert conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0] == 1


def test_text_with_nul_is_refused_on_both_engines(world: h.World, tmp_path: Path) -> None:
    """PostgreSQL's text cannot hold NUL, SQLite's can: the seam refuses it on both (Unstorable),
    and a body field with one is a 400 that names the field, on both."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        with pytest.raises(db.Unstorable):
            db.upsert_user(v.settings.database, "u\x00", "u", "local")
        sub = await _accepted(v, world)
        reply = await v.post(f"/api/v1/operator/submissions/{sub}/audit", user=h.OPERATOR, json={"reason": "a\x00b"})
        assert (reply.status, reply.reason) == (400, "bad_request")
        assert "reason" in reply.json["error"]["message"]
        assert len(db.get_submission(v.settings.database, sub)["history"]) == 1  # type: ignore[index]
        await v.assert_healthy()

    h.run(go())


async def _accepted(v: h.Verifier, world: h.World) -> str:
    reply = await v.upload(world.bundles["plain"])
    assert reply.status == 201, reply.body
    return str(reply.json["id"])


# -- migrations -----------------------------------------------------------------------------------


def test_concurrent_migrations_on_one_database(db_engine: Databases, tmp_path: Path) -> None:
    """Four ``ale-verify migrate`` at once on a new database: each says the version, the
    migrations ran once (SQLite's write lock, PostgreSQL's advisory lock)."""
    database = db_engine.new(tmp_path)
    env = h._env(ALE_VERIFY_DATA=str(tmp_path), DATABASE_URL=_url(database))
    procs = [
        subprocess.Popen([*h.VERIFY_CLI, "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    assert {out for out, _ in outs} == {f"schema version {len(db.MIGRATIONS)}\n"}
    assert h.count(database, "schema_migrations") == len(db.MIGRATIONS)
    assert db.migrate(database) == len(db.MIGRATIONS)  # and again: nothing to do


def test_static_export_is_the_same_from_either_engine(
    tmp_path: Path, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rows, written through the same functions, give the same site byte for byte."""
    sqlite, postgres = tmp_path / "v.sqlite3", pg_cluster.new_database("export")
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: 1_800_000_000.25)  # the audits' and revocations' times
        assert sf.fill_mix(sqlite) == sf.fill_mix(postgres)  # type: ignore[arg-type]
    assert db.all_submissions(sqlite) == db.all_submissions(postgres)
    a = export.export_site(sqlite, tmp_path / "a", docs_dir=None)
    b = export.export_site(postgres, tmp_path / "b", docs_dir=None)
    files_a = {p.relative_to(a.directory): p.read_bytes() for p in a.directory.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b.directory): p.read_bytes() for p in b.directory.rglob("*") if p.is_file()}
    assert files_a == files_b
    assert len(files_a) > 10


# -- two serve processes on one database ----------------------------------------------------------


def _two_servers(world: h.World, tmp: Path, database: Path | str, **env: str) -> list[h.LiveServer]:
    """Two ``ale-verify serve`` on one database, started at once (both migrate it)."""
    common = {"DATABASE_URL": _url(database), "ALE_VERIFY_WORKERS": "0", **env}
    servers = [h.start_live_server(world.keys, tmp, name=f"serve{i}", wait=False, **common) for i in (0, 1)]
    try:
        for server in servers:
            server.wait_healthy()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _race(requests: list[tuple[str, bytes]], auth: dict[str, str]) -> list[httpx.Response]:
    """Send every (url, body) at once, each from its own thread and client; every reply."""
    barrier = threading.Barrier(len(requests))
    replies: list[httpx.Response | BaseException] = [RuntimeError("no reply")] * len(requests)

    def send(i: int, url: str, body: bytes) -> None:
        try:
            with httpx.Client(timeout=300) as client:
                barrier.wait(60)
                replies[i] = client.post(
                    url, content=body, headers={**auth, "Content-Type": "application/octet-stream"}
                )
        except BaseException as exc:  # reported below
            replies[i] = exc

    threads = [threading.Thread(target=send, args=(i, url, body)) for i, (url, body) in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    errors = [r for r in replies if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    return [r for r in replies if isinstance(r, httpx.Response)]


def test_two_serve_processes_accept_one_token_exactly_once(
    world: h.World, db_engine: Databases, tmp_path: Path
) -> None:
    """50 concurrent uploads of one challenge token, spread over two ``ale-verify serve`` on one
    database: exactly one accepted (validated), 49 refused as token_replayed, all recorded."""
    database = db_engine.new(tmp_path)
    servers = _two_servers(world, tmp_path, database, ALE_VERIFY_UPLOADS_PER_HOUR="1000")
    try:
        token = servers[0].token(h.PARTICIPANT)
        auth = {"Authorization": f"Bearer {token}"}
        c = httpx.post(f"{servers[1].url}/api/v1/challenges", headers=auth, timeout=30).json()
        data = h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient)
        replies = _race([(f"{servers[i % 2].url}/api/v1/submissions", data) for i in range(50)], auth)
        verdicts = [r.json() for r in replies]
        assert sorted(r.status_code for r in replies) == [201] + [422] * 49, verdicts
        assert [v["level"] for v in verdicts if v["status"] == "accepted"] == ["validated"]
        assert {v["reason"] for v in verdicts if v["status"] == "rejected"} == {"token_replayed"}
        winner = next(v["id"] for v in verdicts if v["status"] == "accepted")
        assert db.get_challenge(database, c["challenge_id"])["used_by_submission"] == winner  # type: ignore[index]
        assert h.count(database, "submissions") == h.count(database, "audit_log") == 50
        for server in servers:
            assert server.healthy()
            assert not any(server.settings.tmp_dir.iterdir())
    finally:
        for server in servers:
            server.stop()
    for server in servers:
        assert b"Traceback" not in server.log()


def test_rate_limit_holds_across_two_serve_processes(world: h.World, db_engine: Databases, tmp_path: Path) -> None:
    """An hourly limit of 5 uploads, 20 at once over both processes: exactly 5 pass the limit (an
    empty body: 400 empty_upload), 15 are 429 rate_limited."""
    database = db_engine.new(tmp_path)
    servers = _two_servers(world, tmp_path, database, ALE_VERIFY_UPLOADS_PER_HOUR="5")
    try:
        auth = {"Authorization": f"Bearer {servers[0].token(h.PARTICIPANT)}"}
        replies = _race([(f"{servers[i % 2].url}/api/v1/submissions", b"") for i in range(20)], auth)
        reasons = sorted(r.json()["error"]["reason"] for r in replies)
        assert reasons == ["empty_upload"] * 5 + ["rate_limited"] * 15
        assert h.count(database, "rate_events") == 5
    finally:
        for server in servers:
            server.stop()


def test_rate_limit_is_exact_under_concurrency(db_engine: Databases, tmp_path: Path) -> None:
    """16 threads take an hourly limit of 5 at once, three times over: exactly 5 each time (the
    count and the insert are one transaction that holds rate_events against other writers)."""
    database = _migrated(db_engine, tmp_path)
    db.upsert_user(database, "u", "u", "local")
    for round_ in range(3):
        barrier = threading.Barrier(16)
        taken: list[bool] = []

        def take(action: str, barrier: threading.Barrier, taken: list[bool]) -> None:
            barrier.wait(30)
            taken.append(db.take_rate(database, "u", action, 5))

        threads = [threading.Thread(target=take, args=(f"a{round_}", barrier, taken)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(taken) == [False] * 11 + [True] * 5


def test_taking_a_rate_prunes_only_its_own_stale_records_not_every_users(db_engine: Databases, tmp_path: Path) -> None:
    """Every upload takes a rate: deleting everyone's records older than an hour scanned the whole
    table each time. Only the taker's stale records of that action go, and on SQLite through the index."""
    database = _migrated(db_engine, tmp_path)
    for user in ("u", "v"):
        db.upsert_user(database, user, user, "local")
    stale = time.time() - 7200

    def seed(s: db.Session) -> None:
        for user, action in (("u", "upload"), ("u", "login"), ("v", "upload")):
            s.execute("INSERT INTO rate_events VALUES (?, ?, ?)", [user, action, stale])

    db.write(database, seed)
    assert db.take_rate(database, "u", "upload", 5)
    with db.connect(database) as s:
        left = sorted((r["user_id"], r["action"], r["at"] > stale) for r in s.rows("SELECT * FROM rate_events"))
    assert left == [("u", "login", False), ("u", "upload", True), ("v", "upload", False)]
    if isinstance(database, Path):  # SQLite: the plan is a search of the index, not a scan
        with sqlite3.connect(database) as conn:
            plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + db.RATE_PRUNE, ["u", "a", 0]))
        assert "USING COVERING INDEX rate_events_by_user" in plan or "USING INDEX rate_events_by_user" in plan, plan


# -- a bad or vanished database -------------------------------------------------------------------

GARBAGE_URLS = [
    "garbage",
    "",
    "mysql://localhost/ale",
    "sqlite://relative-without-third-slash",
    "sqlite:///",
    "sqlite:///x.sqlite3?mode=ro",
    "postgresql://[::1/ale",
    "postgresql://user:s3cret-pw@localhost:port/ale",
    "postgresql://user:s3cret-pw@localhost:99999/ale",
    "postgresql://ale@/x?sslmode=sometimes&password=s3cret-pw",
    "postgresql://" + "a" * 5000,
    "\x7f\x01binary",
]


@pytest.fixture(scope="module")
def site_keys(tmp_path_factory: pytest.TempPathFactory) -> h.SiteKeys:
    return h.keygen(tmp_path_factory.mktemp("keys") / "site")


@pytest.mark.parametrize("url", GARBAGE_URLS, ids=range(len(GARBAGE_URLS)))
def test_garbage_database_url_is_one_clear_line(site_keys: h.SiteKeys, url: str) -> None:
    """``ale-verify serve`` (and migrate) with a DATABASE_URL that is not one: exit 2, one line on
    stderr naming DATABASE_URL or the database, no traceback, never the password."""
    env = h._env(ALE_VERIFY_DATA=str(site_keys.data_dir), DATABASE_URL=url)
    for command in (["serve", "--bind", f"127.0.0.1:{h.free_port()}"], ["migrate"]):
        proc = subprocess.run(
            [*h.VERIFY_CLI, *command], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("ale-verify: error: "), lines
        assert "DATABASE_URL" in lines[0] or "database" in lines[0].lower(), lines
        assert "Traceback" not in proc.stderr
        assert "s3cret-pw" not in proc.stderr + proc.stdout
        assert '"ready"' not in proc.stdout


def test_unreachable_postgresql_at_start_is_one_clear_line(
    tmp_path: Path, pg_cluster: Cluster, site_keys: h.SiteKeys
) -> None:
    """A well-formed URL with no server behind it (a socket folder with no server, a database that
    does not exist): exit 2, one line that says why (libpq's reason), no traceback, no password."""
    keys = site_keys
    empty = tmp_path / "no-server"
    empty.mkdir()
    urls = {
        f"postgresql://ale:s3cret-pw@{str(empty).replace('/', '%2F')}/ale": "No such file or directory",
        pg_cluster.url("no_such_database"): 'database "no_such_database" does not exist',
    }
    for url, why in urls.items():
        env = h._env(ALE_VERIFY_DATA=str(keys.data_dir), DATABASE_URL=url)
        proc = subprocess.run(
            [*h.VERIFY_CLI, "serve", "--bind", f"127.0.0.1:{h.free_port()}"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("ale-verify: error: cannot use the database (PostgreSQL at postgresql://ale"), lines
        assert why in lines[0]
        assert "Traceback" not in proc.stderr
        assert "s3cret-pw" not in proc.stderr


def _vanish(v: h.Verifier, db_engine: Databases) -> None:
    """The database goes away: PostgreSQL's is dropped (its sessions ended), SQLite's file moved."""
    where = v.settings.database
    if isinstance(where, db.SqliteUrl):
        where.path.rename(where.path.with_name("moved-away.sqlite3"))
    else:
        assert db_engine.cluster is not None
        name = where.url.rsplit("/", 1)[1]
        db_engine.cluster.admin(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_database_gone_mid_request_gives_503_not_500(
    world: h.World, db_engine: Databases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database vanishes during an upload (after the rate limit, before the challenge is
    read): 503 database_unavailable with a clear message and Retry-After, the upload's temp file
    deleted; then every endpoint that needs the database is 503 too; never a 500 or a traceback."""

    monkeypatch.setattr(db, "WAIT_S", 1.0)  # PostgreSQL: how long a request waits for the server

    async def go() -> None:
        v = h.Verifier(world, tmp_path, uploads_per_hour=100)
        c = v.direct_challenge()
        data = h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient)
        sub = await _accepted(v, world)
        auth = v.auth(h.PARTICIPANT)  # the token is made while the database is there
        real = db.take_rate

        def take_then_vanish(*args: Any) -> bool:
            allowed = real(*args)
            _vanish(v, db_engine)
            return allowed

        monkeypatch.setattr(db, "take_rate", take_then_vanish)
        started = time.monotonic()
        reply = await v.upload(data, headers=auth)
        assert (reply.status, reply.reason) == (503, "database_unavailable"), reply.body
        assert reply.json["error"]["message"] == "the database is unavailable; try again later"
        assert reply.headers["Retry-After"] == str(int(db.WAIT_S))
        assert time.monotonic() - started < db.WAIT_S + 20
        assert v.leftovers() == []
        monkeypatch.setattr(db, "take_rate", real)
        for method, path in [
            ("POST", "/api/v1/challenges"),  # the token cannot be looked up
            ("GET", "/api/v1/operator/runner-keys"),
            ("GET", f"/api/v1/submissions/{sub}"),
            ("GET", "/api/v1/leaderboard"),
        ]:
            answer = await v.call(method, path, headers=auth)
            assert (answer.status, answer.reason) == (503, "database_unavailable"), (path, answer.body)
        health = await v.get("/healthz")  # the process itself is fine
        assert health.status == 200

    h.run(go())


# -- DATABASE_URL ---------------------------------------------------------------------------------


def test_database_url_forms(tmp_path: Path) -> None:
    """DATABASE_URL wins over the default; ALE_VERIFY_DATABASE still names a SQLite file; both
    set is refused; the settings' repr never shows a password."""
    data = {"ALE_VERIFY_DATA": str(tmp_path)}
    assert Settings.from_env(data).database == db.SqliteUrl(tmp_path / "verifier.sqlite3")
    assert Settings.from_env({**data, "DATABASE_URL": "sqlite:///rel/v.db"}).database == db.SqliteUrl(Path("rel/v.db"))
    assert Settings.from_env({**data, "DATABASE_URL": "sqlite:////abs/v.db"}).database == db.SqliteUrl(
        Path("/abs/v.db")
    )
    assert Settings.from_env({**data, "ALE_VERIFY_DATABASE": "x.db"}).database == db.SqliteUrl(Path("x.db"))
    pg = Settings.from_env({**data, "DATABASE_URL": "postgresql://ale:pw-secret@db.example:5433/ale"})
    assert pg.database == db.PostgresUrl("postgresql://ale:pw-secret@db.example:5433/ale")
    assert "pw-secret" not in repr(pg) + str(pg.database) + repr(pg.database)
    assert str(pg.database) == "postgresql://ale:***@db.example:5433/ale"
    in_query = db.location("postgresql://ale@/ale?host=/run/pg&password=pw-secret")
    assert "pw-secret" not in str(in_query)
    with pytest.raises(ValueError, match="not both"):
        Settings.from_env({**data, "DATABASE_URL": "sqlite:///a", "ALE_VERIFY_DATABASE": "b"})


@pytest.mark.fuzz
@given(st.one_of(st.text(max_size=200), st.builds(lambda s: "postgresql://" + s, st.text(max_size=200)),
                 st.builds(lambda s: "sqlite://" + s, st.text(max_size=200))))  # fmt: skip
@fuzz_settings
def test_fuzz_database_url(url: str) -> None:
    """Any text is a location or a ValueError that says what is accepted; nothing else is raised."""
    try:
        found = db.location(url)
    except ValueError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert message.startswith(("DATABASE_URL", "a SQLite DATABASE_URL")), message
        return
    assert isinstance(found, db.SqliteUrl | db.PostgresUrl)
    assert db.location(found) == found
    json.dumps(str(found))


def test_a_switch_to_wal_waits_for_another_connections_write_lock_instead_of_database_is_locked(
    tmp_path: Path,
) -> None:
    """SQLite answers ``PRAGMA journal_mode = WAL`` "database is locked" at once, without its busy
    handler, while another connection holds the write lock: four ``ale-verify migrate`` at once on
    a new database failed so (CI). The migration's lock now waits for it, as for any busy lock."""
    path = tmp_path / "v.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    releaser = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    releaser.start()
    try:
        assert db.migrate(db.location(path)) == len(db.MIGRATIONS)
    finally:
        releaser.join()
        holder.close()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_export_reads_a_key_range_unordered_as_ordered_on_either_engine(
    tmp_path: Path, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard worker's read of its key range in the database's order (read_rows ordered=False)
    reads the rows and history the ordered read reads, on SQLite and on PostgreSQL."""
    sqlite, postgres = tmp_path / "v.sqlite3", pg_cluster.new_database("export_ranges")
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: 1_800_000_000.25)
        assert sf.fill_mix(sqlite) == sf.fill_mix(postgres)  # type: ignore[arg-type]
    for database in (sqlite, postgres):
        keys = export.read_keys(database)
        assert len(keys) >= 4
        bounds = [None, keys[1], keys[len(keys) // 2], None]
        for start, stop in itertools.pairwise(bounds):
            ordered = export.read_rows(database, start, stop)
            unordered = export.read_rows(database, start, stop, ordered=False)
            assert ordered.rows
            assert sorted(map(tuple, unordered.rows)) == sorted(map(tuple, ordered.rows))
            assert unordered.history == ordered.history
