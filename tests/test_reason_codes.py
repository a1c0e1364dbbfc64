"""One enum each for reason codes and levels (``ale.core.reasons``), and every copy held to it:
docs/verifier.md, docs/formats.md, the OpenAPI document, the database, and the code that raises."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ale.core.reasons import REASONS, Level, Reason, Use, VerificationError, levels_table, reasons_for, reasons_table
from ale_verify import db, openapi, tokens

ROOT = Path(__file__).resolve().parents[1]
VERIFIER_MD = (ROOT / "docs" / "verifier.md").read_text(encoding="utf-8")
FORMATS_MD = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8")


def _block(text: str, name: str) -> str:
    found = re.findall(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, flags=re.DOTALL)
    assert len(found) == 1, f"docs/verifier.md needs exactly one {name} block"
    return str(found[0])


def test_docs_list_exactly_the_reason_codes_with_their_descriptions() -> None:
    assert _block(VERIFIER_MD, "reasons") == reasons_table(), (
        "docs/verifier.md's reason table is not ale.core.reasons.reasons_table(); paste this:\n" + reasons_table()
    )
    listed = re.findall(r"^\| `([a-z_]+)` \|", _block(VERIFIER_MD, "reasons"), flags=re.MULTILINE)
    assert listed == [r.value for r in Reason]


def test_docs_list_exactly_the_levels_with_their_descriptions() -> None:
    assert _block(VERIFIER_MD, "levels") == levels_table(), levels_table()
    listed = re.findall(r"^\| `([a-z_]+)` \|", _block(VERIFIER_MD, "levels"), flags=re.MULTILINE)
    assert listed == [level.value for level in Level]


def test_every_reason_has_a_description_and_a_use() -> None:
    for reason in Reason:
        info = REASONS[reason]
        assert info.description, reason
        assert info.step, reason
        assert info.uses, reason
        assert reason.value == reason.name.lower()


def test_formats_md_opening_order_names_exactly_the_rejection_codes() -> None:
    section = FORMATS_MD.split("### Opening order and reason codes", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+|[a-z]+)`", section))
    codes = {r.value for r in reasons_for(Use.REJECTION)}
    assert codes - named == set(), "a rejection code the opening order does not name"
    assert {n for n in named if n in {r.value for r in Reason}} == codes


def test_openapi_enumerates_the_codes_and_levels() -> None:
    document = openapi.document("http://127.0.0.1:8000")
    schemas = document["components"]["schemas"]
    error_reason = schemas["Error"]["properties"]["error"]["properties"]["reason"]["enum"]
    assert error_reason == [r.value for r in reasons_for(Use.REQUEST)]
    for name in ("Submission", "Verdict"):
        props = schemas[name]["properties"]
        assert props["reason"]["enum"] == [*(r.value for r in reasons_for(Use.REJECTION)), None]
        assert props["level"]["enum"] == [*(level.value for level in Level), None]
        listed = props["reasons"]["items"]["properties"]["reason"]["enum"]
        assert set(listed) == {r.value for r in (*reasons_for(Use.REJECTION), *reasons_for(Use.NOTE))}


# -- the database ---------------------------------------------------------------------------------


@pytest.fixture
def database(tmp_path: Path, db_engine: Any) -> Path | str:
    """A new verifier database, on each engine (conftest.py's ``db_engine``)."""
    path = db_engine.new(tmp_path)
    db.migrate(path)
    db.upsert_user(path, "u", "u", "local")
    return path


def _row(**over: Any) -> dict[str, Any]:
    row = {
        "id": "sub_1",
        "user_id": "u",
        "received_at": 1.0,
        "ciphertext_sha256": "0" * 64,
        "status": "rejected",
        "level": None,
        "reason": "bad_tar",
        "reasons": [{"reason": "bad_tar", "message": "m"}],
        "run_id": None,
        "summary": {},
    }
    return {**row, **over}


AUDIT = {"at": 1.0, "actor": "verifier", "action": "rejected", "from_level": None, "to_level": None, "reason": "r"}


def test_database_holds_the_enums(database: Path | str) -> None:
    with db.connect(database) as conn:
        codes = dict(conn.execute("SELECT code, uses FROM reason_codes").fetchall())
        levels = {r[0] for r in conn.execute("SELECT name FROM levels").fetchall()}
    assert set(codes) == {r.value for r in Reason}
    assert codes["self_elevation"] == "rejection,request"
    assert levels == {level.value for level in Level}
    assert tuple(level.value for level in Level) == db.LEVELS


@pytest.mark.parametrize(
    "row",
    [
        _row(reason="not_a_code"),
        _row(reason="rate_limited"),  # a request code is never a submission's reason
        _row(reasons=[{"reason": "made_up", "message": "m"}]),
        _row(status="accepted", reason=None, level="platinum"),
    ],
    ids=["unknown-reason", "request-code", "unknown-listed-reason", "unknown-level"],
)
def test_database_refuses_a_code_outside_the_enum(database: Path | str, row: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"is not a valid (Reason|Level)|needs a rejection reason"):  # in Python
        db.insert_submission(database, row, AUDIT)
    # and the database's own triggers, for a writer that bypasses insert_submission
    raw = {**row, "reasons": json.dumps(row["reasons"]), "summary": "{}"}
    with db.connect(database) as conn, pytest.raises(db.Refused, match="unknown"):
        conn.execute(
            f"INSERT INTO submissions ({', '.join(raw)}) VALUES ({', '.join('?' * len(raw))})", list(raw.values())
        )


def test_database_accepts_the_enums_and_refuses_an_unknown_level_change(database: Path | str) -> None:
    db.insert_submission(database, _row(), AUDIT)
    accepted = _row(id="sub_2", status="accepted", reason=None, level=Level.VALIDATED, reasons=[])
    db.insert_submission(database, accepted, {**AUDIT, "action": "accepted", "to_level": Level.VALIDATED})
    assert db.get_submission(database, "sub_2")["level"] == "validated"  # type: ignore[index]
    with pytest.raises(ValueError, match="gold"):
        db.change_level(
            database, "sub_2", actor="op", action="x", to_level="gold", reason="r", allowed_from=("validated",)
        )
    with db.connect(database) as conn, pytest.raises(db.Refused, match="unknown"):
        conn.execute("UPDATE submissions SET level = 'gold' WHERE id = 'sub_2'")


# -- the code that raises -------------------------------------------------------------------------

SOURCES = [*(ROOT / "ale" / "core").glob("*.py"), *(ROOT / "verify").glob("*.py"), ROOT / "ale/runner/inspect.py"]


def test_every_api_error_code_is_a_request_reason() -> None:
    source = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "verify").glob("*.py"))
    raised = set(re.findall(r'ApiError\(\s*\d+,\s*"([a-z_]+)"', source))
    raised |= set(re.findall(r'error_response\(\s*\d+,\s*"([a-z_]+)"', source))
    raised |= set(re.findall(r'\d{3}: "([a-z_]+)"', source))  # the HTTP error mapping
    assert raised, "the pattern no longer finds the app's error codes"
    assert raised <= {r.value for r in reasons_for(Use.REQUEST)}


def test_verification_errors_are_raised_with_enum_members_only() -> None:
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r'(VerificationError|BundleError)\(\s*["\']', text), f"{path}: a string reason"
    with pytest.raises(ValueError, match="no_such_code"):
        VerificationError("no_such_code", "x")  # type: ignore[arg-type]


def test_token_error_reasons_are_rejection_codes() -> None:
    source = Path(tokens.__file__).read_text(encoding="utf-8")
    found = set(re.findall(r'TokenError\(\s*"([a-z_]+)"', source))
    assert found == {"token_invalid", "token_expired"}
    assert found <= {r.value for r in reasons_for(Use.REJECTION)}
