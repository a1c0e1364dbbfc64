"""The verifier's HTTP API: levels end to end (``ale run --site``, ``ale submit``), the operator API
and its append-only audit log, refused self-elevation, the size cap, rate limits, retention, key
custody, and concurrent replays against a live hypercorn server."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import verifier_helpers as h

from ale.core import bundle
from ale_verify import db
from ale_verify.config import Settings


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@pytest.fixture(scope="session")
def live_world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    """The world for the tests of the live ``ale-verify serve`` alone (its own SQLite database:
    the runs' challenges are its own), run once; the engines' live tests are in test_verifier_postgres.py."""
    return h.get_world(tmp_path_factory, request.config)


def _submit_cli(world: h.World, ciphertext: bytes, tmp: Path, token: str) -> tuple[int, dict[str, Any]]:
    path = tmp / "bundle.ale"
    path.write_bytes(ciphertext)
    proc = subprocess.run(
        [*h.RUNNER_CLI, "submit", str(path), "--site", world.live.url, "--token", token, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=h._env(),
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _live_get(world: h.World, path: str) -> dict[str, Any]:
    reply = httpx.get(f"{world.live.url}{path}", timeout=30)
    assert reply.status_code == 200, reply.text
    h.assert_no_secret(world.keys, reply.content, path)
    return reply.json()


# -- levels, end to end ----------------------------------------------------------------------------


def test_site_run_is_validated_then_its_token_is_spent(live_world: h.World, tmp_path: Path) -> None:
    """``ale run --site`` then ``ale submit``: validated; the same bundle again: token_replayed."""
    world = live_world
    token = world.live.token(h.PARTICIPANT)
    code, verdict = _submit_cli(world, world.bundles["site"], tmp_path, token)
    assert code == 0, verdict
    assert (verdict["status"], verdict["level"], verdict["reasons"]) == ("accepted", "validated", [])
    stored = _live_get(world, f"/api/v1/submissions/{verdict['id']}")
    assert stored["level"] == "validated"
    assert stored["summary"]["challenge_id"]
    assert stored["summary"]["runner"] is None
    assert stored["summary"]["official_episode_counts"] is True
    code, again = _submit_cli(world, world.bundles["site"], tmp_path, token)
    assert code == 1
    assert (again["status"], again["reason"]) == ("rejected", "token_replayed")
    assert world.live.healthy()


def test_registered_runner_is_officially_verified(live_world: h.World, tmp_path: Path) -> None:
    """``ale run --site --runner-key`` with a key the operator registered: officially_verified."""
    world = live_world
    code, verdict = _submit_cli(world, world.bundles["signed"], tmp_path, world.live.token(h.PARTICIPANT))
    assert code == 0, verdict
    assert (verdict["status"], verdict["level"]) == ("accepted", "officially_verified")
    runner = _live_get(world, f"/api/v1/submissions/{verdict['id']}")["summary"]["runner"]
    assert runner == {"key_id": world.runner_key_id, "kind": "benchmark_team", "label": "the test runner"}


def test_self_reported_levels(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        plain = world.files("plain")
        # no challenge, --episodes override
        reply = await v.upload(world.bundles["plain"])
        assert (reply.status, reply.json["level"]) == (201, "self_reported")
        assert [r["reason"] for r in reply.json["reasons"]] == ["no_challenge", "unofficial_episodes"]
        # a challenge, but --episodes override
        c = await v.challenge()
        reply = await v.upload(h.encrypt_files(h.rebind(plain, c["nonce"], c["token"]), world.keys.recipient))
        assert (reply.status, reply.json["level"]) == (201, "self_reported")
        assert [r["reason"] for r in reply.json["reasons"]] == ["unofficial_episodes"]
        # official counts, no challenge
        reply = await v.upload(h.encrypt_files(h.unbind(world.files("site")), world.keys.recipient))
        assert (reply.status, reply.json["level"]) == (201, "self_reported")
        assert [r["reason"] for r in reply.json["reasons"]] == ["no_challenge"]
        await v.assert_healthy()

    h.run(go())


async def _register(v: h.Verifier, world: h.World) -> str:
    reply = await v.post(
        "/api/v1/operator/runner-keys",
        user=h.OPERATOR,
        json={"public_key": world.runner_public, "kind": "official_rerun", "label": "rerun box"},
    )
    assert reply.status == 201, reply.body
    return str(reply.json["key_id"])


def test_runner_key_lifecycle(world: h.World, tmp_path: Path) -> None:
    """Unregistered: refused; registered: officially_verified (only with a challenge); retired: refused."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        signed, key = world.files("signed"), world.runner_key()

        async def bound() -> bytes:
            c = await v.challenge()
            return h.encrypt_files(h.rebind(signed, c["nonce"], c["token"], runner_key=key), world.keys.recipient)

        reply = await v.upload(await bound())
        assert (reply.status, reply.json["reason"]) == (422, "unregistered_runner")
        key_id = await _register(v, world)
        assert key_id == world.runner_key_id
        reply = await v.upload(await bound())
        assert (reply.status, reply.json["level"]) == (201, "officially_verified")
        # a registered signature does not make up for a missing challenge
        reply = await v.upload(h.encrypt_files(h.unbind(signed, runner_key=key), world.keys.recipient))
        assert (reply.status, reply.json["level"]) == (201, "self_reported")
        listed = await v.get("/api/v1/operator/runner-keys", user=h.OPERATOR)
        assert [k["key_id"] for k in listed.json["keys"]] == [key_id]
        assert listed.json["keys"][0]["retired_at"] is None
        retired = await v.call("DELETE", f"/api/v1/operator/runner-keys/{key_id}", user=h.OPERATOR)
        assert retired.status == 200
        assert retired.json == {"key_id": key_id, "retired": True}
        reply = await v.upload(await bound())
        assert (reply.status, reply.json["reason"]) == (422, "unregistered_runner")
        again = await v.call("DELETE", f"/api/v1/operator/runner-keys/{key_id}", user=h.OPERATOR)
        assert (again.status, again.reason) == (404, "not_found")
        dup = await v.post(
            "/api/v1/operator/runner-keys",
            user=h.OPERATOR,
            json={"public_key": world.runner_public, "kind": "benchmark_team", "label": "again"},
        )
        assert (dup.status, dup.reason) == (409, "conflict")
        await v.assert_healthy()

    h.run(go())


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"public_key": "not base64!", "kind": "benchmark_team", "label": "x"}, "bad_request"),
        ({"public_key": "AAAA", "kind": "benchmark_team", "label": "x"}, "bad_request"),
        ({"public_key": "A" * 43 + "=", "kind": "root", "label": "x"}, "bad_request"),
        ({"public_key": "A" * 43 + "=", "kind": "benchmark_team"}, "bad_request"),
        ({"public_key": "A" * 43 + "=", "kind": "benchmark_team", "label": "x", "extra": 1}, "unknown_field"),
        ({"public_key": "A" * 43 + "=", "kind": "benchmark_team", "label": "x", "level": "audited"}, "self_elevation"),
    ],
)
def test_runner_key_registration_refuses(world: h.World, tmp_path: Path, body: dict[str, Any], reason: str) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.post("/api/v1/operator/runner-keys", user=h.OPERATOR, json=body)
        assert (reply.status, reply.reason) == (400, reason)
        assert (await v.get("/api/v1/operator/runner-keys", user=h.OPERATOR)).json["keys"] == []

    h.run(go())


# -- the operator API and the audit log -------------------------------------------------------------


async def _validated(v: h.Verifier, world: h.World, user: str = h.PARTICIPANT) -> str:
    c = await v.challenge(user)
    reply = await v.upload(
        h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient), user=user
    )
    assert (reply.status, reply.json["level"]) == (201, "validated"), reply.body
    return str(reply.json["id"])


def test_audit_and_revoke_are_logged_with_reasons(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        first, second = await _validated(v, world), await _validated(v, world, "another")
        audited = await v.post(
            f"/api/v1/operator/submissions/{first}/audit",
            user=h.OPERATOR,
            json={"reason": "reviewed the trajectory by hand"},
        )
        assert audited.status == 200
        assert audited.json["level"] == "audited"
        revoked = await v.post(
            f"/api/v1/operator/submissions/{second}/revoke",
            user=h.OPERATOR,
            json={"reason": "the agent read the hidden seeds"},
        )
        assert revoked.status == 200
        assert revoked.json["level"] == "revoked"
        history = (await v.submission(second))["history"]
        assert [(x["actor"], x["action"], x["from_level"], x["to_level"], x["reason"]) for x in history] == [
            ("verifier", "accepted", None, "validated", "all checks passed"),
            (h.OPERATOR, "revoked", "validated", "revoked", "the agent read the hidden seeds"),
        ]
        assert (await v.submission(first))["history"][-1]["reason"] == "reviewed the trajectory by hand"
        # revoked: kept on the board, marked, unranked
        rows = (await v.get("/api/v1/leaderboard")).json["rows"]
        assert [(r["submission_id"], r["level"], r["rank"]) for r in rows] == [
            (first, "audited", 1),
            (second, "revoked", None),
        ]
        conflict = await v.post(
            f"/api/v1/operator/submissions/{second}/audit", user=h.OPERATOR, json={"reason": "un-revoke it"}
        )
        assert (conflict.status, conflict.reason) == (409, "conflict")
        revoke_audited = await v.post(
            f"/api/v1/operator/submissions/{first}/revoke", user=h.OPERATOR, json={"reason": "found a problem later"}
        )
        assert revoke_audited.status == 200
        assert revoke_audited.json["level"] == "revoked"
        missing = await v.post("/api/v1/operator/submissions/sub_nope/audit", user=h.OPERATOR, json={"reason": "x"})
        assert (missing.status, missing.reason) == (404, "not_found")
        await v.assert_healthy()

    h.run(go())


def test_rejected_submissions_cannot_be_audited(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        bad = await v.upload(b"age-encryption.org/v1\nnot really\n")
        assert bad.status == 422
        for action in ("audit", "revoke"):
            reply = await v.post(
                f"/api/v1/operator/submissions/{bad.json['id']}/{action}", user=h.OPERATOR, json={"reason": "trying"}
            )
            assert (reply.status, reply.reason) == (409, "conflict")
        assert (await v.submission(bad.json["id"]))["level"] is None

    h.run(go())


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (None, 400, "bad_request"),
        ([], 400, "bad_request"),
        ({}, 400, "bad_request"),
        ({"reason": ""}, 400, "bad_request"),
        ({"reason": "   "}, 400, "bad_request"),
        ({"reason": 5}, 400, "bad_request"),
        ({"reason": "x" * 2001}, 400, "bad_request"),
        ({"reason": "ok", "note": "x"}, 400, "unknown_field"),
        ({"reason": "ok", "level": "officially_verified"}, 400, "self_elevation"),
        ({"reason": "ok", "to_level": "officially_verified"}, 400, "unknown_field"),
    ],
)
def test_operator_bodies_are_strict(world: h.World, tmp_path: Path, body: Any, status: int, reason: str) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        sub = await _validated(v, world)
        kw: dict[str, Any] = {"data": b"not json"} if body is None else {"json": body}
        reply = await v.post(f"/api/v1/operator/submissions/{sub}/audit", user=h.OPERATOR, **kw)
        assert (reply.status, reply.reason) == (status, reason)
        assert (await v.submission(sub))["level"] == "validated"

    h.run(go())


def test_operator_endpoints_need_an_operator(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        sub = await _validated(v, world)
        calls = [
            ("POST", f"/api/v1/operator/submissions/{sub}/audit", {"json": {"reason": "me"}}),
            ("POST", f"/api/v1/operator/submissions/{sub}/revoke", {"json": {"reason": "me"}}),
            ("GET", "/api/v1/operator/runner-keys", {}),
            (
                "POST",
                "/api/v1/operator/runner-keys",
                {"json": {"public_key": world.runner_public, "kind": "benchmark_team", "label": "mine"}},
            ),
            ("DELETE", f"/api/v1/operator/runner-keys/{world.runner_key_id}", {}),
        ]
        for method, path, kw in calls:
            anonymous = await v.call(method, path, **kw)
            assert (anonymous.status, anonymous.reason) == (401, "unauthenticated"), path
            participant = await v.call(method, path, user=h.PARTICIPANT, **kw)
            assert (participant.status, participant.reason) == (403, "forbidden"), path
            forged = await v.call(method, path, headers={"Authorization": "Bearer ale_forged"}, **kw)
            assert forged.status == 401, path
        assert (await v.submission(sub))["level"] == "validated"
        assert db.runner_keys(v.settings.database) == []

    h.run(go())


def test_audit_log_is_append_only(world: h.World, tmp_path: Path) -> None:
    """The database refuses UPDATE and DELETE on the audit log (its own triggers, on each engine:
    the engine's own driver here, past the verifier's code); appending is allowed."""

    async def go() -> object:
        v = h.Verifier(world, tmp_path)
        sub = await _validated(v, world)
        reply = await v.post(f"/api/v1/operator/submissions/{sub}/revoke", user=h.OPERATOR, json={"reason": "x"})
        assert reply.status == 200
        return v.settings.database

    database = h.run(go())
    with h.raw_connect(database) as conn:
        before = conn.execute("SELECT * FROM audit_log ORDER BY seq").fetchall()
        assert len(before) == 2
        for statement in (
            "UPDATE audit_log SET reason = 'nothing happened'",
            "UPDATE audit_log SET to_level = 'validated' WHERE action = 'revoked'",
            "DELETE FROM audit_log",
            "DELETE FROM audit_log WHERE action = 'revoked'",
        ):
            with pytest.raises(h.driver_errors(), match="append-only"):
                conn.execute(statement)
        assert conn.execute("SELECT * FROM audit_log ORDER BY seq").fetchall() == before
        conn.execute(
            "INSERT INTO audit_log (submission_id, at, actor, action, from_level, to_level, reason) "
            "VALUES ('s', 0, 'a', 'b', NULL, NULL, 'appending is allowed')"
        )
        assert len(conn.execute("SELECT * FROM audit_log").fetchall()) == 3


# -- no upload field can raise a level ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("level=audited", "self_elevation"),
        ("verification_level=officially_verified", "self_elevation"),
        ("officially_verified=true", "self_elevation"),
        ("audited=1", "self_elevation"),
        ("verified=1", "self_elevation"),
        ("status=accepted", "self_elevation"),
        ("runner=benchmark_team", "unknown_field"),
        ("level=audited&x=1", "self_elevation"),
    ],
)
def test_upload_query_fields_are_refused(world: h.World, tmp_path: Path, query: str, reason: str) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.upload(world.bundles["plain"], query=query)
        assert (reply.status, reply.reason) == (400, reason)
        assert (await v.get("/api/v1/leaderboard")).json["rows"] == []
        await v.assert_healthy()

    h.run(go())


def test_headers_and_challenge_params_raise_nothing(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        refused = await v.post("/api/v1/challenges?level=audited", user=h.PARTICIPANT)
        assert refused.status == 400
        assert refused.reason in ("self_elevation", "unknown_field")
        c = await v.challenge()
        data = h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient)
        reply = await v.upload(
            data, headers={"X-Verification-Level": "officially_verified", "X-Level": "audited", "Level": "audited"}
        )
        assert (reply.status, reply.json["level"]) == (201, "validated")

    h.run(go())


# -- size cap, rate limits, authentication -------------------------------------------------------------


CAP = 20 * 1024 * 1024


def test_default_cap_is_20_mb() -> None:
    assert (
        Settings(database=Path("d"), key_file=Path("k"), signing_key_file=Path("s"), tmp_dir=Path("t")).max_upload_bytes
        == CAP
    )
    assert Settings.from_env({}).max_upload_bytes == CAP


def test_cap_by_content_length_is_enforced_early(world: h.World, tmp_path: Path) -> None:
    """A declared length over the cap is refused before any of the body is sent."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.stream_upload([], headers={"Content-Length": str(CAP + 1)}, complete=False, answer_within=20)
        assert (reply.status, reply.reason) == (413, "too_large")
        reply = await v.upload(b"\0" * (CAP + 1))
        assert (reply.status, reply.reason) == (413, "too_large")
        await v.assert_healthy()

    h.run(go())


def test_cap_is_enforced_while_reading_a_chunked_body(world: h.World, tmp_path: Path) -> None:
    """No Content-Length and a body that never ends: the answer comes once the cap is passed."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        sent: list[int] = []
        bound = 3 * CAP // 65536

        def endless() -> Any:
            for _ in range(bound):
                sent.append(1)
                yield b"\0" * 65536

        reply = await v.stream_upload(endless(), complete=False, pace=0.001)
        assert (reply.status, reply.reason) == (413, "too_large")
        assert CAP // 65536 <= len(sent) < bound, "refused before the cap, or only after the body ended"
        await v.assert_healthy()
        # exactly at the cap is read and judged (not a bundle, so rejected, not refused)
        reply = await v.stream_upload([b"\0" * 65536] * (CAP // 65536))
        assert (reply.status, reply.json["reason"]) == (422, "not_age")
        await v.assert_healthy()

    h.run(go())


def test_cap_follows_the_setting(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path, max_upload_bytes=4096)
        reply = await v.upload(world.bundles["plain"])
        assert (reply.status, reply.reason) == (413, "too_large")
        assert (await v.get("/api/v1/submission-key")).json["max_upload_bytes"] == 4096
        await v.assert_healthy()

    h.run(go())


def test_live_server_cap(live_world: h.World) -> None:
    """Over real HTTP (hypercorn): a declared length over the cap and a chunked body over it."""
    world = live_world
    headers = {"Authorization": f"Bearer {world.live.token('big-sender')}", "Content-Type": "application/octet-stream"}
    url = f"{world.live.url}/api/v1/submissions"

    def chunks() -> Any:
        for _ in range(CAP // (1 << 20) + 2):
            yield b"\0" * (1 << 20)

    chunked = httpx.post(url, content=chunks(), headers=headers, timeout=120)
    assert "content-length" not in chunked.request.headers
    assert chunked.status_code == 413
    assert chunked.json()["error"]["reason"] == "too_large"
    declared = httpx.post(url, content=b"\0" * (CAP + 1), headers=headers, timeout=120)
    assert declared.status_code == 413
    assert declared.json()["error"]["reason"] == "too_large"
    assert world.live.healthy()
    assert not any(world.live.settings.tmp_dir.iterdir())


def test_upload_rate_limit(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path, uploads_per_hour=2)
        for _ in range(2):
            assert (await v.upload(world.bundles["plain"])).status == 201
        limited = await v.upload(world.bundles["plain"])
        assert (limited.status, limited.reason) == (429, "rate_limited")
        other = await v.upload(world.bundles["plain"], user="someone-else")
        assert other.status == 201
        await v.assert_healthy()

    h.run(go())


def test_challenge_rate_limit(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path, challenges_per_hour=1)
        await v.challenge()
        limited = await v.post("/api/v1/challenges", user=h.PARTICIPANT)
        assert (limited.status, limited.reason) == (429, "rate_limited")

    h.run(go())


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer ale_nope"},
        {"Authorization": "Basic eDp5"},
        {"Authorization": "Bearer " + "x" * 600},
    ],
)
def test_uploads_and_challenges_need_a_token(world: h.World, tmp_path: Path, headers: dict[str, str]) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        for path in ("/api/v1/submissions", "/api/v1/challenges"):
            reply = await v.post(path, headers=headers, data=world.bundles["plain"])
            assert (reply.status, reply.reason) == (401, "unauthenticated")
        await v.assert_healthy()

    h.run(go())


# -- public reads ---------------------------------------------------------------------------------


def test_public_endpoints(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        key = await v.get("/api/v1/submission-key")
        assert key.json == {"recipient": world.keys.recipient, "format": "age-x25519", "max_upload_bytes": CAP}
        for path, status in [
            ("/api/v1/leaderboard?category=robots", 400),
            ("/api/v1/leaderboard?category=open&x=1", 400),
            ("/api/v1/submissions/sub_unknown", 404),
            ("/api/v1/submissions/" + "x" * 65, 404),
            ("/api/v1/nothing", 404),
        ]:
            reply = await v.get(path)
            assert reply.status == status, path
            assert reply.json["error"]["reason"], path
        assert (await v.call("PUT", "/api/v1/submissions")).status == 405
        plain = await v.upload(world.bundles["plain"])
        sub = await _validated(v, world)
        for category, expected in (("overall", 2), ("open", 2), ("reproduction", 0)):
            board = await v.get(f"/api/v1/leaderboard?category={category}")
            assert board.status == 200
            assert len(board.json["rows"]) == expected
        rows = (await v.get("/api/v1/leaderboard")).json["rows"]
        assert {r["submission_id"]: r["level"] for r in rows} == {plain.json["id"]: "self_reported", sub: "validated"}
        assert all(r["covered"] == 1 and r["required"] == 4 for r in rows)

    h.run(go())


# -- retention ------------------------------------------------------------------------------------


def test_bundles_are_not_kept_by_default(world: h.World, tmp_path: Path) -> None:
    assert Settings.from_env({}).keep_bundles is False
    assert Settings.from_env({"KEEP_SUBMISSION_BUNDLES": "false"}).keep_bundles is False
    assert Settings.from_env({"KEEP_SUBMISSION_BUNDLES": "true"}).keep_bundles is True

    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        assert v.settings.keep_bundles is False
        assert (await v.upload(world.bundles["plain"])).status == 201
        await _validated(v, world)
        assert (await v.upload(b"junk")).status == 422
        assert v.leftovers() == []
        assert not v.settings.bundle_dir.exists() or not any(v.settings.bundle_dir.iterdir())

    h.run(go())


def test_keep_bundles_keeps_the_ciphertext(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path, keep_bundles=True)
        reply = await v.upload(world.bundles["plain"])
        assert reply.status == 201
        kept = v.settings.bundle_dir / f"{reply.json['id']}.ale"
        assert kept.read_bytes() == world.bundles["plain"]
        assert list(v.settings.tmp_dir.iterdir()) == []

    h.run(go())


# -- key custody ----------------------------------------------------------------------------------


def test_private_keys_never_appear_in_responses_or_logs(
    world: h.World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every endpoint, success and failure alike; the log at DEBUG. (Every response of every test in
    these files is also checked by :class:`verifier_helpers.Verifier`.)"""
    caplog.set_level(logging.DEBUG)

    async def go() -> list[h.Reply]:
        v = h.Verifier(world, tmp_path)
        sub = await _validated(v, world)
        await v.upload(world.bundles["plain"])
        await v.upload(h.encrypt_files(world.files("plain"), world.keys.recipient)[:-1])
        await v.upload(b"age-encryption.org/v1\n-> X25519 AAAA\nAAAA\n--- AAAA\n")
        await v.upload(world.bundles["plain"][:-5])
        await v.upload(world.bundles["plain"], query="level=audited")
        for path in (
            "/healthz",
            "/api/v1/openapi.json",
            "/api/v1/submission-key",
            "/api/v1/leaderboard",
            f"/api/v1/submissions/{sub}",
            "/auth/login",
            "/auth/whoami",
            "/auth/callback?state=x&code=y",
        ):
            await v.get(path)
        await v.post("/auth/tokens", user=h.PARTICIPANT)
        await v.post("/api/v1/operator/runner-keys", user=h.OPERATOR, data=b"\xff\xfe")  # a logged 500 today
        await v.post("/auth/logout")
        await v.get("/api/v1/operator/runner-keys", user=h.OPERATOR)
        await v.post(f"/api/v1/operator/submissions/{sub}/audit", user=h.OPERATOR, json={"reason": "ok"})
        return v.replies

    replies = h.run(go())
    assert len(replies) >= 18
    for reply in replies:
        h.assert_no_secret(world.keys, reply.body, "a response body")
        for name, value in reply.headers.items():
            h.assert_no_secret(world.keys, f"{name}: {value}", "a response header")
    for record in caplog.records:
        h.assert_no_secret(world.keys, record.getMessage(), "a log record")
        if record.exc_text:
            h.assert_no_secret(world.keys, record.exc_text, "a logged traceback")
    h.assert_no_secret(world.keys, caplog.text, "the captured log")
    settings = world.settings(tmp_path)
    h.assert_no_secret(world.keys, repr(settings) + str(settings), "Settings' repr")


def test_live_server_log_and_answers_hold_no_secret(live_world: h.World, tmp_path: Path) -> None:
    world = live_world
    token = world.live.token("log-checker")
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=world.live.url, timeout=60) as client:
        replies = [
            client.post("/api/v1/submissions", content=b"garbage", headers=auth),
            client.post("/api/v1/submissions", content=world.bundles["plain"], headers=auth),
            client.post("/api/v1/submissions?level=audited", content=world.bundles["plain"], headers=auth),
            client.post("/api/v1/challenges", headers=auth),
            client.get("/api/v1/submission-key"),
            client.get("/api/v1/openapi.json"),
            client.get("/auth/login"),
            client.get("/api/v1/operator/runner-keys", headers=auth),
        ]
    for reply in replies:
        assert reply.status_code < 500
        h.assert_no_secret(world.keys, reply.content, f"the live answer to {reply.request.url}")
        h.assert_no_secret(world.keys, str(reply.headers), "live headers")
    assert world.live.healthy()
    log = world.live.log()
    assert b"/api/v1/submissions" in log, "the access log is on, so the check below reads real lines"
    h.assert_no_secret(world.keys, log, "the live server's log")


# -- concurrent replays against the live server ------------------------------------------------------


def test_live_replay_race_exactly_one_wins(live_world: h.World) -> None:
    world = live_world
    token = world.live.token("racer")
    auth = {"Authorization": f"Bearer {token}"}
    challenge = httpx.post(f"{world.live.url}/api/v1/challenges", headers=auth, timeout=30)
    assert challenge.status_code == 201, challenge.text
    c = challenge.json()
    data = h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient)
    barrier = threading.Barrier(10)
    replies: list[httpx.Response] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def racer() -> None:
        try:
            with httpx.Client(timeout=120) as client:
                barrier.wait(30)
                reply = client.post(
                    f"{world.live.url}/api/v1/submissions",
                    content=data,
                    headers={**auth, "Content-Type": "application/octet-stream"},
                )
            with lock:
                replies.append(reply)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert len(replies) == 10
    verdicts = [r.json() for r in replies]  # well-formed JSON, every one
    assert sorted(r.status_code for r in replies) == [201] + [422] * 9, verdicts
    assert [v["level"] for v in verdicts if v["status"] == "accepted"] == ["validated"]
    assert {v["reason"] for v in verdicts if v["status"] == "rejected"} == {"token_replayed"}
    for v in verdicts:
        assert set(v) == {"id", "status", "level", "reason", "reasons", "url"}
    assert world.live.healthy()
    assert not any(world.live.settings.tmp_dir.iterdir())


def test_hostile_uploads_leave_the_live_server_answering(live_world: h.World) -> None:
    world = live_world
    auth = {"Authorization": f"Bearer {world.live.token('hostile')}"}
    plain = world.files("plain")
    hostile = [
        b"",
        b"\0" * 100,
        world.bundles["plain"][:100],
        h.encrypt(b"x", world.keys.recipient),
        h.encrypt(bundle.compress(h.raw_tar(h.member("../../x", data=b"y"))), world.keys.recipient),
        h.encrypt_files({**plain, "notes.txt": b"hi"}, world.keys.recipient),
    ]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=world.live.url, timeout=60, headers=auth) as client:
            return list(await asyncio.gather(*(client.post("/api/v1/submissions", content=b) for b in hostile)))

    for reply in h.run(send_all()):
        assert reply.status_code in (400, 422), reply.text
        assert reply.json()
        assert world.live.healthy()
    assert not any(world.live.settings.tmp_dir.iterdir())
