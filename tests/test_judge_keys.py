"""Judge keys through the operator API (docs/verifier.md, "Faithfulness"): registered, listed and
revoked in the database (migration 3) beside the configuration's ``ALE_VERIFY_JUDGE_KEYS``; a
verdict signed by a revoked key is no longer credited: the revocation re-scores every submission it
credited, so the API, the board and the next export show those tasks unjudged. Hostile bodies are
refused without storing anything. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from judge_helpers import Runs, get_runs

from ale.core.signing import key_id
from ale_verify import db, export, judging, pipeline

PENDULUM, REACHER = "pendulum-lqr@1.0.0", "reacher-jacobian@1.0.0"
KEYS = "/api/v1/operator/judge-keys"


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@pytest.fixture(scope="session")
def runs(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return get_runs(tmp_path_factory, world.keys.recipient, world.keys.identity)


def _kid(public: str) -> str:
    return key_id(base64.b64decode(public))


async def _submit(v: h.Verifier, files: dict[str, bytes]) -> dict[str, Any]:
    """Upload the files bound to a fresh challenge; the stored submission as the API gives it."""
    challenge = v.direct_challenge()
    reply = await v.upload(h.encrypt_files(h.rebind(files, challenge["nonce"], challenge["token"]),
                                           v.world.keys.recipient))  # fmt: skip
    assert reply.status == 201, reply.body
    return await v.submission(reply.json["id"])


def _task(stored: dict[str, Any], ref: str) -> dict[str, Any]:
    return next(t for t in stored["summary"]["tasks"] if t["task"] == ref)


def _export_rows(v: h.Verifier, out: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    export.export_site(v.settings.database, out, docs_dir=None)
    data = json.loads((out / "leaderboard.json").read_text())
    rows = csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text(), newline=""))
    return {r["submission_id"]: r for r in data["submissions"]}, {r["submission_id"]: r for r in rows}


def _key_entries(database: Any) -> list[tuple[str, str, str]]:
    with h.raw_connect(database) as conn:
        rows = conn.execute(
            "SELECT submission_id, action, actor FROM audit_log WHERE action LIKE 'judge_key_%' ORDER BY seq"
        ).fetchall()
    return [tuple(r) for r in rows]


# -- the lifecycle ---------------------------------------------------------------------------------


def test_judge_key_lifecycle_registered_credited_exported_revoked_and_rescored(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    public, kid = runs.judge_public_key, _kid(runs.judge_public_key)

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        before = await _submit(v, runs.judged)  # the key is not registered yet: not credited
        assert before["judgements"][PENDULUM]["state"] == "unjudged"

        reply = await v.post(KEYS, user=h.OPERATOR, json={"public_key": public, "label": "team judge"})
        assert reply.status == 201, reply.body
        assert {k: reply.json[k] for k in ("key_id", "public_key", "label", "source", "active", "revoked_at")} == {
            "key_id": kid, "public_key": public, "label": "team judge", "source": "api", "active": True,
            "revoked_at": None,
        }  # fmt: skip
        assert reply.json["registered_by"] == h.OPERATOR
        listed = (await v.get(KEYS, user=h.OPERATOR)).json["keys"]
        assert [k["key_id"] for k in listed] == [kid]

        credited = await _submit(v, runs.judged)
        pendulum = _task(credited, PENDULUM)
        assert (pendulum["faithful"], pendulum["final"]) == (True, pendulum["score"])
        assert pendulum["judgement"]["judge_key_id"] == kid
        assert credited["judgements"] == {
            PENDULUM: {"state": "judged_faithful", "judged_by": "judge_key", "judge_key_id": kid,
                       "judge_model": "judge-model-1", "reason": None},
            REACHER: {"state": "unjudged", "judged_by": None, "judge_key_id": None, "judge_model": None,
                      "reason": _task(credited, REACHER)["judgement"]["rationale"]},
        }  # fmt: skip
        assert credited["summary"]["categories"]["reproduction"] > 0

        data, rows = _export_rows(v, tmp_path / "site")
        row, cells = data[credited["id"]], rows[credited["id"]]
        assert (row["judged_faithful"], row["unjudged"], row["judged_unfaithful"], row["judging_pending"]) == (
            [PENDULUM], [REACHER], [], [],
        )  # fmt: skip
        assert row["judged_by"] == [f"{PENDULUM}=judge_key:{kid}"]
        assert row["task_judgements"] == credited["judgements"]
        assert (cells["judged_faithful"], cells["unjudged"], cells["judged_by"]) == (
            PENDULUM, REACHER, f"{PENDULUM}=judge_key:{kid}",
        )  # fmt: skip
        assert data[before["id"]]["unjudged"] == [PENDULUM, REACHER]

        revoked = await v.post(f"{KEYS}/{kid}/revoke", user=h.OPERATOR, json={"reason": "its CI secret leaked"})
        assert revoked.status == 200, revoked.body
        assert revoked.json["rescored"] == [credited["id"]]
        key = revoked.json["key"]
        assert (key["active"], key["revoked_by"], key["revoke_reason"]) == (False, h.OPERATOR, "its CI secret leaked")

        after = await v.submission(credited["id"])
        pendulum = _task(after, PENDULUM)
        assert (pendulum["faithful"], pendulum["final"], pendulum["judgement"]["status"]) == (False, 0, "unjudged")
        assert "revoked" in pendulum["judgement"]["rationale"]
        assert "its CI secret leaked" in pendulum["judgement"]["rationale"]
        assert after["summary"]["categories"]["reproduction"] == 0
        assert after["judgements"][PENDULUM]["state"] == "unjudged"
        unjudged = [n["message"].split(":")[0] for n in after["reasons"] if n["reason"] == "unjudged"]
        assert unjudged == [PENDULUM, REACHER]
        last = after["history"][-1]
        assert (last["action"], last["actor"], last["from_level"], last["to_level"]) == (
            "rescored", "verifier", after["level"], after["level"],
        )  # fmt: skip

        data, _ = _export_rows(v, tmp_path / "site")  # the next export
        assert (data[credited["id"]]["unjudged"], data[credited["id"]]["judged_by"]) == ([PENDULUM, REACHER], [])

        later = await _submit(v, runs.judged)  # a verdict the revoked key signs is not credited any more
        assert later["judgements"][PENDULUM]["state"] == "unjudged"
        assert "not by a judge key this verifier has registered" in _task(later, PENDULUM)["judgement"]["rationale"]

        again = await v.post(f"{KEYS}/{kid}/revoke", user=h.OPERATOR, json={"reason": "twice"})
        assert (again.status, again.reason) == (409, "conflict")
        back = await v.post(KEYS, user=h.OPERATOR, json={"public_key": public, "label": "team judge, again"})
        assert (back.status, back.reason) == (409, "conflict")  # a revoked key stays revoked
        listed = (await v.get(KEYS, user=h.OPERATOR)).json["keys"]
        assert [(k["key_id"], k["active"]) for k in listed] == [(kid, False)]
        assert _key_entries(v.settings.database) == [
            (f"judge-key:{kid}", "judge_key_registered", h.OPERATOR),
            (f"judge-key:{kid}", "judge_key_revoked", h.OPERATOR),
        ]
        await v.assert_healthy()

    h.run(go())


def test_a_configured_judge_key_keeps_working_and_an_operator_can_revoke_it(
    world: h.World, runs: Runs, tmp_path: Path
) -> None:
    public, kid = runs.judge_public_key, _kid(runs.judge_public_key)

    async def go() -> None:
        v = h.Verifier(world, tmp_path, judge_keys=(("ci judge", public),))
        credited = await _submit(v, runs.judged)
        assert credited["judgements"][PENDULUM]["judge_key_id"] == kid
        (listed,) = (await v.get(KEYS, user=h.OPERATOR)).json["keys"]
        assert (listed["key_id"], listed["source"], listed["active"], listed["registered_at"]) == (
            kid, "configuration", True, None,
        )  # fmt: skip
        dup = await v.post(KEYS, user=h.OPERATOR, json={"public_key": public, "label": "again"})
        assert (dup.status, dup.reason) == (409, "conflict")
        revoked = await v.post(f"{KEYS}/{kid}/revoke", user=h.OPERATOR, json={"reason": "rotated"})
        assert revoked.status == 200, revoked.body
        assert revoked.json["rescored"] == [credited["id"]]
        assert revoked.json["key"]["source"] == "configuration"
        assert (await v.submission(credited["id"]))["judgements"][PENDULUM]["state"] == "unjudged"
        later = await _submit(v, runs.judged)  # the configuration still lists it: the database's revocation wins
        assert later["judgements"][PENDULUM]["state"] == "unjudged"
        (listed,) = (await v.get(KEYS, user=h.OPERATOR)).json["keys"]
        assert (listed["source"], listed["active"]) == ("configuration", False)

    h.run(go())


def test_a_key_revoked_while_an_upload_is_checked_is_not_credited_to_it(
    world: h.World, runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload credited the key at step 12; the key is revoked before the upload is stored, so
    the revocation could not see it: storing it re-scores it in the same transaction."""
    public, kid = runs.judge_public_key, _kid(runs.judge_public_key)
    real = pipeline._persist

    async def go() -> None:
        v = h.Verifier(world, tmp_path)

        def revoke_first(*args: Any, **kwargs: Any) -> bool:
            db.revoke_judge_key(v.settings.database, kid, actor=h.OPERATOR, reason="meanwhile", configured=None,
                                rescore=judging.after_revocation)  # fmt: skip
            return real(*args, **kwargs)

        assert (await v.post(KEYS, user=h.OPERATOR, json={"public_key": public, "label": "team"})).status == 201
        monkeypatch.setattr(pipeline, "_persist", revoke_first)
        stored = await _submit(v, runs.judged)
        pendulum = _task(stored, PENDULUM)
        assert (pendulum["final"], pendulum["judgement"]["status"]) == (0, "unjudged")
        assert "meanwhile" in pendulum["judgement"]["rationale"]
        assert [entry["action"] for entry in stored["history"]] == ["accepted", "rescored"]
        assert stored["judgements"][PENDULUM]["state"] == "unjudged"

    h.run(go())


# -- hostile bodies --------------------------------------------------------------------------------

_PRIVATE = Ed25519PrivateKey.generate()
_RAW = _PRIVATE.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
PUBLIC = base64.b64encode(_RAW).decode()
PEM = (
    _PRIVATE.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)
HOSTILE: dict[str, tuple[dict[str, Any], bytes | None, int, str]] = {
    # name: (headers, raw body (None: the JSON of the first member's "json"), status, reason)
    "garbage-pem": ({}, json.dumps({"public_key": "-----BEGIN PUBLIC KEY-----\nnot a key at all\n-----END PUBLIC "
                                                   "KEY-----\n", "label": "x"}).encode(), 400, "bad_request"),
    "real-pem": ({}, json.dumps({"public_key": PEM, "label": "x"}).encode(), 400, "bad_request"),
    "pem-body": ({"Content-Type": "application/x-pem-file"}, PEM.encode(), 415, "unsupported_media_type"),
    "not-base64": ({}, b'{"public_key": "not base64!", "label": "x"}', 400, "bad_request"),
    "31-bytes": ({}, json.dumps({"public_key": base64.b64encode(_RAW[:31]).decode(), "label": "x"}).encode(), 400,
                 "bad_request"),
    "33-bytes": ({}, json.dumps({"public_key": base64.b64encode(_RAW + b"\0").decode(), "label": "x"}).encode(), 400,
                 "bad_request"),
    "no-label": ({}, json.dumps({"public_key": PUBLIC}).encode(), 400, "bad_request"),
    "blank-label": ({}, json.dumps({"public_key": PUBLIC, "label": "   "}).encode(), 400, "bad_request"),
    "nul-label": ({}, json.dumps({"public_key": PUBLIC, "label": "a\u0000b"}).encode(), 400, "bad_request"),
    "long-label": ({}, json.dumps({"public_key": PUBLIC, "label": "x" * 2001}).encode(), 400, "bad_request"),
    "extra-field": ({}, json.dumps({"public_key": PUBLIC, "label": "x", "kind": "judge"}).encode(), 400,
                    "unknown_field"),
    "level-field": ({}, json.dumps({"public_key": PUBLIC, "label": "x", "level": "audited"}).encode(), 400,
                    "self_elevation"),
    "duplicate-json-keys": ({}, f'{{"public_key": "{PUBLIC}", "label": "x", "label": "y"}}'.encode(), 400,
                            "bad_request"),
    "deep-json": ({}, b'{"public_key": ' + b"[" * 10_000 + b"]" * 10_000 + b', "label": "x"}', 400, "bad_request"),
    "oversized": ({}, json.dumps({"public_key": PUBLIC, "label": "x" * (200 * 1024)}).encode(), 413, "too_large"),
    "array": ({}, b"[]", 400, "bad_request"),
    "not-json": ({}, b"\xff\xfe garbage", 400, "bad_request"),
    "number-key": ({}, json.dumps({"public_key": 12, "label": "x"}).encode(), 400, "bad_request"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_judge_key_registration_refuses_hostile_bodies_and_stores_nothing(
    world: h.World, tmp_path: Path, case: str
) -> None:
    headers, body, status, reason = HOSTILE[case]

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.post(KEYS, user=h.OPERATOR, data=body,
                             headers={"Content-Type": "application/json", **headers})  # fmt: skip
        assert (reply.status, reply.reason) == (status, reason), reply.body
        assert (await v.get(KEYS, user=h.OPERATOR)).json["keys"] == []
        assert db.judge_keys(v.settings.database) == []
        assert _key_entries(v.settings.database) == []
        await v.assert_healthy()

    h.run(go())


def test_the_same_key_twice_in_any_spelling_is_a_conflict_and_stored_canonical(world: h.World, tmp_path: Path) -> None:
    """Base64 of 32 bytes has spellings that decode alike (the last character's two unused bits);
    a key is one key id, stored as the spelling verdicts carry (else no verdict would match it)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    other = PUBLIC[:-2] + alphabet[alphabet.index(PUBLIC[-2]) | 1] + "="  # an unused bit set
    assert other != PUBLIC
    assert base64.b64decode(other) == _RAW

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        first = await v.post(KEYS, user=h.OPERATOR, json={"public_key": other, "label": "one"})
        assert first.status == 201, first.body
        assert first.json["public_key"] == PUBLIC  # canonical
        for spelling in (PUBLIC, other):
            dup = await v.post(KEYS, user=h.OPERATOR, json={"public_key": spelling, "label": "two"})
            assert (dup.status, dup.reason) == (409, "conflict")
        assert [k["key_id"] for k in (await v.get(KEYS, user=h.OPERATOR)).json["keys"]] == [key_id(_RAW)]

    h.run(go())


@pytest.mark.parametrize(
    ("key", "body", "status", "reason"),
    [
        ("0" * 64, {"reason": "unknown"}, 404, "not_found"),
        ("f" * 63, {"reason": "short"}, 404, "not_found"),
        ("a" * 65, {"reason": "long"}, 404, "not_found"),
        ("..%2F..%2Fetc", {"reason": "path"}, 404, "not_found"),
        ("0" * 64, {}, 400, "bad_request"),
        ("0" * 64, {"reason": "x", "level": "revoked"}, 400, "self_elevation"),
    ],
)
def test_revoking_an_unknown_key_id_or_without_a_reason_changes_nothing(
    world: h.World, tmp_path: Path, key: str, body: dict[str, Any], status: int, reason: str
) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        assert (await v.post(KEYS, user=h.OPERATOR, json={"public_key": PUBLIC, "label": "kept"})).status == 201
        reply = await v.post(f"{KEYS}/{key}/revoke", user=h.OPERATOR, json=body)
        assert (reply.status, reply.reason) == (status, reason), reply.body
        (kept,) = db.judge_keys(v.settings.database)
        assert kept["revoked_at"] is None
        assert len(_key_entries(v.settings.database)) == 1

    h.run(go())


def test_judge_key_endpoints_are_for_operators_only(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        calls = [
            ("GET", KEYS, {}),
            ("POST", KEYS, {"json": {"public_key": PUBLIC, "label": "mine"}}),
            ("POST", f"{KEYS}/{key_id(_RAW)}/revoke", {"json": {"reason": "mine"}}),
        ]
        for method, path, kw in calls:
            anonymous = await v.call(method, path, **kw)
            assert (anonymous.status, anonymous.reason) == (401, "unauthenticated"), path
            participant = await v.call(method, path, user=h.PARTICIPANT, **kw)
            assert (participant.status, participant.reason) == (403, "forbidden"), path
        assert db.judge_keys(v.settings.database) == []

    h.run(go())
