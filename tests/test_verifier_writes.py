"""Group commit (``db.write``), on both engines: concurrent writes share one transaction and one
commit, a write that fails is rolled back alone, a commit that fails fails every write of it and
stores none of them (an upload then answers 503 and loses nothing: its challenge stays unused),
and a challenge's use is stored with the verdict that uses it."""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from pg_cluster import Databases

from ale_verify import db
from ale_verify._web import STATE_KEY
from ale_verify.app import close as close_app


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


def _migrated(db_engine: Databases, tmp: Path) -> Path | str:
    database = db_engine.new(tmp)
    db.migrate(database)
    db.upsert_user(database, "u", "u", "local")
    return database


def _rates(database: Path | str, action: str) -> int:
    """How many committed rate events of ``action`` another connection sees."""
    with db.connect(database) as s:
        return int(s.one("SELECT COUNT(*) FROM rate_events WHERE action = ?", [action])[0])


def _insert_rate(action: str) -> Any:
    return lambda s: s.execute("INSERT INTO rate_events VALUES (?, ?, ?)", ["u", action, time.time()])


class _Held:
    """A first write that holds the writer thread until ``release``: the writes submitted
    meanwhile wait together and go in its next commit."""

    def __init__(self, database: Path | str) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=db.write, args=(database, self._hold))
        self.thread.start()
        assert self.entered.wait(30)

    def _hold(self, s: db.Session) -> None:
        self.entered.set()
        assert self.release.wait(60)


def _in_threads(database: Path | str, units: list[Any]) -> list[Future[Any]]:
    futures: list[Future[Any]] = []
    for unit in units:
        future: Future[Any] = Future()

        def run(unit: Any = unit, future: Future[Any] = future) -> None:
            try:
                future.set_result(db.write(database, unit))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run).start()
        futures.append(future)
    return futures


def _queued(database: Path | str, n: int) -> None:
    """Wait until ``n`` writes wait in the writer's queue (behind the held one)."""
    writer = db._WRITERS[db.location(database)]
    deadline = time.monotonic() + 30
    while writer._queue.qsize() < n:
        assert time.monotonic() < deadline, "the writes did not reach the writer"
        time.sleep(0.01)


def test_concurrent_writes_share_one_commit_and_each_sees_the_ones_before(db_engine: Databases, tmp_path: Path) -> None:
    database = _migrated(db_engine, tmp_path)
    outside: list[int] = []

    def unit(s: db.Session) -> int:
        _insert_rate("shared")(s)
        outside.append(_rates(database, "shared"))  # another connection: only what is committed
        return int(s.one("SELECT COUNT(*) FROM rate_events WHERE action = 'shared'")[0])

    held = _Held(database)
    futures = _in_threads(database, [unit] * 8)
    _queued(database, 8)
    held.release.set()
    seen = sorted(f.result(timeout=60) for f in futures)
    held.thread.join(60)
    assert seen == list(range(1, 9))  # one after the other, each seeing the writes before it
    assert outside == [0] * 8  # none of them committed before the last had run: one transaction
    assert _rates(database, "shared") == 8  # and all committed when their callers returned


def test_a_failing_write_is_rolled_back_alone_and_the_others_of_its_commit_are_stored(
    db_engine: Databases, tmp_path: Path
) -> None:
    database = _migrated(db_engine, tmp_path)

    def refused(s: db.Session) -> None:
        _insert_rate("failing")(s)  # rolled back with the rest of this write
        s.execute("INSERT INTO users (id, display_name, source, created_at) VALUES ('u', 'u', 'local', 0)")

    held = _Held(database)
    futures = _in_threads(database, [_insert_rate("kept"), refused, _insert_rate("kept")])
    _queued(database, 3)
    held.release.set()
    futures[0].result(timeout=60)
    futures[2].result(timeout=60)
    with pytest.raises(db.Refused):
        futures[1].result(timeout=60)
    assert (_rates(database, "kept"), _rates(database, "failing")) == (2, 0)


def test_the_database_failing_in_the_middle_of_a_commit_fails_all_its_writes_and_stores_none(
    db_engine: Databases, tmp_path: Path
) -> None:
    database = _migrated(db_engine, tmp_path)

    def unavailable(s: db.Session) -> None:
        raise db.Unavailable("cannot use the database: gone")

    held = _Held(database)
    futures = _in_threads(database, [_insert_rate("lost"), unavailable, _insert_rate("lost")])
    _queued(database, 3)
    held.release.set()
    for future in futures:
        with pytest.raises(db.Unavailable, match="gone"):
            future.result(timeout=60)
    assert _rates(database, "lost") == 0
    db.write(database, _insert_rate("after"))  # the next commit has a connection again
    assert _rates(database, "after") == 1


def test_a_write_inside_a_write_is_refused_not_a_deadlock(db_engine: Databases, tmp_path: Path) -> None:
    database = _migrated(db_engine, tmp_path)
    with pytest.raises(RuntimeError, match="wait for itself"):
        db.write(database, lambda s: db.write(database, _insert_rate("inner")))
    assert _rates(database, "inner") == 0


def test_a_write_names_only_known_lock_tables(db_engine: Databases, tmp_path: Path) -> None:
    database = _migrated(db_engine, tmp_path)
    with pytest.raises(ValueError, match="not a table"):
        db.write(database, _insert_rate("x"), lock=["users; DROP TABLE users"])


# -- a full disk at the commit: 503, nothing stored, nothing lost ------------------------------------


def _disk_full(engine: str) -> BaseException:
    if engine == "sqlite":
        exc = sqlite3.OperationalError("database or disk is full")
        exc.sqlite_errorcode = 13  # type: ignore[attr-defined]  # SQLITE_FULL
        return exc
    import psycopg

    return psycopg.errors.DiskFull("could not extend file: No space left on device")


class _FullAtCommit:
    """A connection whose commits fail as on a full disk while ``full`` is set."""

    def __init__(self, conn: Any, error: BaseException, full: threading.Event) -> None:
        self._conn, self._error, self._full = conn, error, full

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self._full.is_set():
            raise self._error
        return self._conn.execute(sql, *args)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_full_disk_at_commit_is_503_and_the_upload_is_not_lost(
    world: h.World, db_engine: Databases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The commit that would store the verdict fails (disk full): 503 database_unavailable, one
    line, Retry-After; nothing is stored and the challenge is not used, so the same bundle is
    accepted once the disk has room again."""
    full = threading.Event()
    real = db._Writer._connection

    def connection(self: Any, found: Any) -> Any:
        return _FullAtCommit(real(self, found), _disk_full(db_engine.engine), full)

    monkeypatch.setattr(db._Writer, "_connection", connection)

    async def go() -> None:
        v = h.Verifier(world, tmp_path, workers=workers)
        state = v.app.extensions[STATE_KEY]
        try:
            v.token()
            c = v.direct_challenge()
            data = h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient)
            full.set()
            reply = await v.upload(data)
            assert (reply.status, reply.reason) == (503, "database_unavailable"), reply.body
            assert "\n" not in reply.json["error"]["message"]
            assert reply.headers["Retry-After"] == str(int(db.WAIT_S))
            assert db.all_submissions(v.settings.database) == []
            challenge = db.get_challenge(v.settings.database, c["challenge_id"])
            assert challenge is not None
            assert challenge["used_at"] is None
            assert v.leftovers() == []
            full.clear()
            again = await v.upload(data)
            assert (again.status, again.json["level"]) == (201, "validated"), again.body
            await v.assert_healthy()
        finally:
            await close_app(state)

    h.run(go())
