"""SQLite's kept connections (``db.connect`` on each thread's connection, ``SqliteEngine.kept``): a
query costs no new connection, yet it always reads the file at the database's path, and a failure
leaves nothing behind."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
import site_fixtures as sf

from ale_verify import db, export, export_watch


def _database(tmp: Path, name: str, user: str) -> Path:
    path = tmp / name
    db.migrate(path)
    db.upsert_user(path, user, user, "local")
    return path


def _token(path: Path, user: str) -> str:
    return db.create_api_token(path, user, "t")


def test_a_thread_queries_the_database_on_one_kept_connection(tmp_path: Path) -> None:
    path = _database(tmp_path, "a.sqlite3", "alice")
    token = _token(path, "alice")
    engine = db.engine(path)
    assert isinstance(engine, db.SqliteEngine)
    assert db.user_for_token(path, token) == "alice"
    first = engine._kept.held[0]
    assert db.user_for_token(path, token) == "alice"
    assert engine._kept.held[0] is first
    seen: list[object] = []

    def other() -> None:  # another thread: a connection of its own
        assert db.user_for_token(path, token) == "alice"
        seen.append(engine._kept.held[0])

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(seen) == 1
    assert seen[0] is not first


def test_a_kept_connection_reads_the_file_that_replaced_the_database(tmp_path: Path) -> None:
    path = _database(tmp_path, "a.sqlite3", "alice")
    token = _token(path, "alice")
    other = _database(tmp_path, "b.sqlite3", "bob")
    bobs = _token(other, "bob")
    for done in (path, other):
        db.close(done)  # (their writers' last connections: the WALs are in the files, and gone)
    assert db.user_for_token(path, token) == "alice"  # a kept connection to a's file
    engine = db.engine(path)
    assert isinstance(engine, db.SqliteEngine)
    kept = engine._kept.held[0]
    shutil.copyfile(other, tmp_path / "c.sqlite3")
    (tmp_path / "c.sqlite3").replace(path)
    assert db.user_for_token(path, bobs) == "bob"
    assert db.user_for_token(path, token) is None
    assert engine._kept.held[0] is not kept


def test_a_kept_connection_to_a_database_removed_is_unavailable_not_the_old_file(tmp_path: Path) -> None:
    path = _database(tmp_path, "a.sqlite3", "alice")
    token = _token(path, "alice")
    assert db.user_for_token(path, token) == "alice"
    path.unlink()
    with pytest.raises(db.Unavailable):
        db.user_for_token(path, token)


def test_a_failure_on_a_kept_connection_closes_it(tmp_path: Path) -> None:
    path = _database(tmp_path, "a.sqlite3", "alice")
    engine = db.engine(path)
    assert isinstance(engine, db.SqliteEngine)
    with pytest.raises(db.Refused), db.connect(path) as s:
        s.execute("INSERT INTO users (id, display_name, source, created_at) VALUES ('alice', 'x', 'local', 0)")
    assert engine._kept.held is None
    with db.connect(path) as s:
        s.execute("BEGIN")  # a transaction left open is not kept either
    assert engine._kept.held is None
    with db.connect(path) as s:
        assert s.one("SELECT COUNT(*) FROM users")[0] == 1


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_export_leaves_the_database_files_as_it_found_them(tmp_path: Path, jobs: int) -> None:
    """An export is a batch job's read: it keeps no connection open after it (``db.connect(keep=
    False)``), so the database's files (the file, its write-ahead log) are as they were, and
    ``export-site --every`` does not take the export itself for a commit. The exporter's kept
    connection used to leave a write-ahead log behind that the next look saw as a change."""
    filled = tmp_path / "filled.sqlite3"
    sf.fill_many(filled, export.PARALLEL_FROM + 10 if jobs > 1 else 5)
    database = tmp_path / "verifier.sqlite3"
    with sqlite3.connect(filled) as source, sqlite3.connect(database) as copy:
        source.backup(copy)  # a file no connection of this process has open: an idle site's
    copy.close()
    source.close()
    before = export_watch.file_state(database)
    assert before is not None
    for n in range(2):
        export.export_site(database, tmp_path / "site", docs_dir=None, jobs=jobs)
        assert export_watch.file_state(database) == before, f"after export {n + 1}"
