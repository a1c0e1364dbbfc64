"""All database access of the verifier: SQLite through sqlite-utils, WAL, numbered migrations.

Every function here is blocking and opens its own connection, so callers run it in a worker
thread (``await run_db(fn, ...)``); no other module touches SQL. Another engine can replace this
module behind the same functions.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from ale.core.reasons import REASONS, Level, Reason, Use

LEVELS = tuple(level.value for level in Level)
RUNNER_KINDS = ("benchmark_team", "approved_third_party", "hardware_attested", "official_rerun")

MIGRATIONS: list[str] = [
    # 1: the initial schema
    """
    CREATE TABLE users (
        id TEXT PRIMARY KEY,
        display_name TEXT NOT NULL,
        source TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE api_tokens (
        token_sha256 TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        label TEXT NOT NULL,
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    CREATE TABLE challenges (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        nonce TEXT NOT NULL UNIQUE,
        issued_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        used_at REAL,
        used_by_submission TEXT
    );
    CREATE TABLE submissions (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL REFERENCES users(id),
        received_at REAL NOT NULL,
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
    CREATE TABLE audit_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        submission_id TEXT NOT NULL,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        from_level TEXT,
        to_level TEXT,
        reason TEXT NOT NULL
    );
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TABLE runner_keys (
        key_id TEXT PRIMARY KEY,
        public_key TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL CHECK (kind IN
            ('benchmark_team', 'approved_third_party', 'hardware_attested', 'official_rerun')),
        label TEXT NOT NULL,
        registered_at REAL NOT NULL,
        registered_by TEXT NOT NULL,
        retired_at REAL
    );
    CREATE TABLE rate_events (
        user_id TEXT NOT NULL,
        action TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX rate_events_by_user ON rate_events(user_id, action, at);
    """,
    # 2: the vocabulary (ale.core.reasons, loaded by migrate()) and triggers that hold every row to it
    """
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
]


class Conflict(Exception):
    """A state change that is not allowed (e.g. a challenge already used)."""


@contextmanager
def connect(path: Path) -> Iterator[sqlite_utils.Database]:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        yield sqlite_utils.Database(conn)
    finally:
        conn.close()


def migrate(path: Path) -> int:
    """Create or upgrade the database; return its schema version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with connect(path) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL)")
        done = {row[0] for row in db.execute("SELECT version FROM schema_migrations").fetchall()}
        for version, script in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            db.conn.executescript(
                f"BEGIN IMMEDIATE;\n{script}\nINSERT INTO schema_migrations VALUES ({version}, {time.time()});\nCOMMIT;"
            )
        _load_vocabulary(db)
        return len(MIGRATIONS)


def _load_vocabulary(db: sqlite_utils.Database) -> None:
    """The reason codes and levels of ale.core.reasons, as the triggers of migration 2 read them.
    Codes are added and their uses updated, never removed (old rows keep theirs)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for reason, info in REASONS.items():
            uses = ",".join(sorted(u.value for u in info.uses))
            db.execute(
                "INSERT INTO reason_codes (code, uses) VALUES (?, ?) "
                "ON CONFLICT(code) DO UPDATE SET uses = excluded.uses",
                [reason.value, uses],
            )
        for level in Level:
            db.execute("INSERT OR IGNORE INTO levels (name) VALUES (?)", [level.value])
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


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
    notes = []
    for item in row["reasons"]:
        code = Reason(item["reason"])
        if not REASONS[code].uses & {Use.REJECTION, Use.NOTE} or not isinstance(item["message"], str):
            raise ValueError(f"{code} is not a rejection reason or a note")
        notes.append({"reason": code.value, "message": item["message"]})
    return {
        **row,
        "reason": None if reason is None else Reason(reason).value,
        "level": None if level is None else Level(level).value,
        "reasons": notes,
    }


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# -- users and API tokens --------------------------------------------------------------------


def upsert_user(path: Path, user_id: str, display_name: str, source: str) -> None:
    with connect(path) as db:
        db.execute(
            "INSERT INTO users (id, display_name, source, created_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET display_name = excluded.display_name",
            [user_id, display_name, source, time.time()],
        )


def create_api_token(path: Path, user_id: str, label: str) -> str:
    """A new API token for the user; only its SHA-256 is stored."""
    token = "ale_" + secrets.token_urlsafe(32)
    with connect(path) as db:
        db.execute(
            "INSERT INTO api_tokens (token_sha256, user_id, label, created_at) VALUES (?, ?, ?, ?)",
            [_token_hash(token), user_id, label, time.time()],
        )
    return token


def user_for_token(path: Path, token: str) -> str | None:
    with connect(path) as db:
        row = db.execute(
            "SELECT user_id FROM api_tokens WHERE token_sha256 = ? AND revoked_at IS NULL", [_token_hash(token)]
        ).fetchone()
    return row[0] if row else None


# -- rate limits -----------------------------------------------------------------------------


def take_rate(path: Path, user_id: str, action: str, per_hour: int) -> bool:
    """Record one ``action`` unless the user already did ``per_hour`` of them in the last hour."""
    now = time.time()
    with connect(path) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM rate_events WHERE at < ?", [now - 3600])
            (count,) = db.execute(
                "SELECT COUNT(*) FROM rate_events WHERE user_id = ? AND action = ? AND at >= ?",
                [user_id, action, now - 3600],
            ).fetchone()
            if count >= per_hour:
                db.execute("COMMIT")
                return False
            db.execute("INSERT INTO rate_events VALUES (?, ?, ?)", [user_id, action, now])
            db.execute("COMMIT")
            return True
        except BaseException:
            db.execute("ROLLBACK")
            raise


# -- challenges ------------------------------------------------------------------------------


def create_challenge(path: Path, user_id: str, ttl_s: int) -> dict[str, Any]:
    now = time.time()
    challenge = {
        "id": "chl_" + secrets.token_hex(12),
        "user_id": user_id,
        "nonce": secrets.token_hex(32),
        "issued_at": now,
        "expires_at": now + ttl_s,
    }
    with connect(path) as db:
        db.table("challenges").insert(challenge)
    return challenge


def get_challenge(path: Path, challenge_id: str) -> dict[str, Any] | None:
    with connect(path) as db:
        rows = list(db.query("SELECT * FROM challenges WHERE id = ?", [challenge_id]))
    return rows[0] if rows else None


def consume_challenge(path: Path, challenge_id: str, submission_id: str) -> None:
    """Mark a challenge used, exactly once: concurrent uploads race here and one wins."""
    with connect(path) as db:
        cur = db.execute(
            "UPDATE challenges SET used_at = ?, used_by_submission = ? WHERE id = ? AND used_at IS NULL",
            [time.time(), submission_id, challenge_id],
        )
        if cur.rowcount != 1:
            raise Conflict("the challenge token was already used")


# -- submissions and the audit log -----------------------------------------------------------


def insert_submission(path: Path, row: dict[str, Any], audit: dict[str, Any]) -> None:
    """Store a submission and its first audit entry; codes and levels must be the vocabulary's."""
    row = _check_codes(row)
    audit = {**audit, "to_level": None if audit["to_level"] is None else Level(audit["to_level"]).value}
    with connect(path) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.table("submissions").insert(
                {**row, "reasons": json.dumps(row["reasons"]), "summary": json.dumps(row["summary"], sort_keys=True)}
            )
            db.table("audit_log").insert({**audit, "submission_id": row["id"]})
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "reasons": json.loads(row["reasons"]), "summary": json.loads(row["summary"])}


def get_submission(path: Path, submission_id: str) -> dict[str, Any] | None:
    with connect(path) as db:
        rows = list(db.query("SELECT * FROM submissions WHERE id = ?", [submission_id]))
        if not rows:
            return None
        history = list(db.query("SELECT * FROM audit_log WHERE submission_id = ? ORDER BY seq", [submission_id]))
    return {**_decode(rows[0]), "history": history}


def ranked_submissions(path: Path) -> list[dict[str, Any]]:
    """Accepted, not revoked, for the leaderboard (the export also shows revoked rows, marked)."""
    with connect(path) as db:
        rows = list(db.query("SELECT * FROM submissions WHERE status = 'accepted' ORDER BY received_at"))
    return [_decode(r) for r in rows]


def all_submissions(path: Path) -> list[dict[str, Any]]:
    with connect(path) as db:
        rows = list(db.query("SELECT * FROM submissions ORDER BY received_at"))
        history = list(db.query("SELECT * FROM audit_log ORDER BY seq"))
    by_id: dict[str, list[dict[str, Any]]] = {}
    for h in history:
        by_id.setdefault(h["submission_id"], []).append(h)
    return [{**_decode(r), "history": by_id.get(r["id"], [])} for r in rows]


def change_level(
    path: Path,
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
    with connect(path) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT status, level FROM submissions WHERE id = ?", [submission_id]).fetchone()
            if row is None:
                raise KeyError(submission_id)
            status, level = row
            if status != "accepted" or level not in allowed_from:
                raise Conflict(f"a {status} submission at level {level} cannot be moved to {to_level}")
            db.execute("UPDATE submissions SET level = ? WHERE id = ?", [to_level, submission_id])
            db.table("audit_log").insert(
                {
                    "submission_id": submission_id,
                    "at": time.time(),
                    "actor": actor,
                    "action": action,
                    "from_level": level,
                    "to_level": to_level,
                    "reason": reason,
                }
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    result = get_submission(path, submission_id)
    assert result is not None
    return result


# -- runner keys -----------------------------------------------------------------------------


def register_runner_key(path: Path, *, key_id: str, public_key: str, kind: str, label: str, actor: str) -> None:
    with connect(path) as db:
        try:
            db.table("runner_keys").insert(
                {
                    "key_id": key_id,
                    "public_key": public_key,
                    "kind": kind,
                    "label": label,
                    "registered_at": time.time(),
                    "registered_by": actor,
                    "retired_at": None,
                }
            )
        except sqlite3.IntegrityError:
            raise Conflict("this runner key is already registered") from None


def retire_runner_key(path: Path, key_id: str) -> None:
    with connect(path) as db:
        cur = db.execute(
            "UPDATE runner_keys SET retired_at = ? WHERE key_id = ? AND retired_at IS NULL", [time.time(), key_id]
        )
        if cur.rowcount != 1:
            raise KeyError(key_id)


def runner_key(path: Path, key_id: str) -> dict[str, Any] | None:
    with connect(path) as db:
        rows = list(db.query("SELECT * FROM runner_keys WHERE key_id = ?", [key_id]))
    return rows[0] if rows else None


def runner_keys(path: Path) -> list[dict[str, Any]]:
    with connect(path) as db:
        return list(db.query("SELECT * FROM runner_keys ORDER BY registered_at"))
