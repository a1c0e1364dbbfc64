"""Hostile request inputs to the verifier's API: every JSON body (size, depth, numbers, duplicate
keys, encodings, media types, shapes), path and query parameters, headers, the OAuth provider's
replies and the challenge token's payload. Each answer is a 4xx with a JSON error naming the fault
(or the provider's 502), never a 500, and nothing changes. Plus a Hypothesis fuzz target per
body-reading endpoint."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
import verifier_helpers as h
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale_verify import bodies, db, openapi, tokens

KEY = "A" * 43 + "="  # base64 of 32 zero bytes: a well-formed Ed25519 public key


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@attrs.frozen
class Endpoint:
    path: str  # {sub} is a submission id
    user: str
    valid: dict[str, Any]  # a body it accepts


BODY_ENDPOINTS = {
    "challenges": Endpoint("/api/v1/challenges", h.PARTICIPANT, {}),
    "audit": Endpoint("/api/v1/operator/submissions/{sub}/audit", h.OPERATOR, {"reason": "reviewed"}),
    "revoke": Endpoint("/api/v1/operator/submissions/{sub}/revoke", h.OPERATOR, {"reason": "found a problem"}),
    "runner-keys": Endpoint(
        "/api/v1/operator/runner-keys", h.OPERATOR, {"public_key": KEY, "kind": "benchmark_team", "label": "x"}
    ),
}
JSON = {"Content-Type": "application/json"}


class Site:
    """An in-process verifier with one submission in its database, and what must not change."""

    def __init__(self, world: h.World, tmp: Path, **overrides: Any) -> None:
        self.v = h.Verifier(world, tmp, challenges_per_hour=10**6, uploads_per_hour=10**6, **overrides)
        self.sub = ""

    async def setup(self) -> Site:
        rejected = await self.v.upload(b"age-encryption.org/v1\nnot really\n")
        assert rejected.status == 422
        self.sub = rejected.json["id"]
        return self

    async def send(self, name: str, body: bytes, headers: dict[str, str] | None = None) -> h.Reply:
        ep = BODY_ENDPOINTS[name]
        path = ep.path.format(sub=self.sub)
        return await self.v.post(path, user=ep.user, data=body, headers=JSON if headers is None else headers)

    def unchanged(self) -> None:
        database = self.v.settings.database
        assert db.get_submission(database, self.sub)["level"] is None
        assert len(db.get_submission(database, self.sub)["history"]) == 1
        assert db.runner_keys(database) == []


def _error(reply: h.Reply, status: int, reason: str) -> str:
    assert (reply.status, reply.reason) == (status, reason), reply.body[:300]
    assert reply.headers["Content-Type"].startswith("application/json")
    message = reply.json["error"]["message"]
    assert isinstance(message, str)
    assert len(message) < 1000
    return str(message)


def _submission_count(v: h.Verifier) -> int:
    return h.count(v.settings.database, "submissions")


def _each_endpoint(world: h.World, tmp: Path, body: bytes, status: int, reason: str, says: str = "") -> None:
    async def go() -> None:
        site = await Site(world, tmp).setup()
        for name in BODY_ENDPOINTS:
            message = _error(await site.send(name, body), status, reason)
            assert says in message, (name, message)
        site.unchanged()
        await site.v.assert_healthy()

    h.run(go())


# -- JSON bodies: one bounded parser, typed at once ------------------------------------------------


def test_body_of_200k_nested_arrays_is_413_not_500(world: h.World, tmp_path: Path) -> None:
    _each_endpoint(world, tmp_path, b"[" * 200_000 + b"]" * 200_000, 413, "too_large", str(bodies.MAX_JSON_BODY))


def test_body_nested_5000_deep_within_the_size_cap_is_400_not_500(world: h.World, tmp_path: Path) -> None:
    deep = b'{"reason": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    _each_endpoint(world, tmp_path, deep, 400, "bad_request", f"deeper than {bodies.MAX_JSON_DEPTH}")


def test_body_one_level_past_the_depth_limit_is_400(world: h.World, tmp_path: Path) -> None:
    n = bodies.MAX_JSON_DEPTH
    deep = b'{"reason": ' + b"[" * n + b"]" * n + b"}"  # depth n + 1
    _each_endpoint(world, tmp_path, deep, 400, "bad_request", "deeper than")


@pytest.mark.parametrize(
    "body",
    [b"9" * 5000, b'{"reason": ' + b"9" * 5000 + b"}", b'{"reason": "x", "n": -' + b"1" * 4000 + b"}"],
    ids=["bare", "in-field", "extra-field"],
)
def test_body_with_a_5000_digit_integer_is_400_not_500(world: h.World, tmp_path: Path, body: bytes) -> None:
    _each_endpoint(world, tmp_path, body, 400, "bad_request", "the body")


def test_body_with_a_duplicate_key_is_400(world: h.World, tmp_path: Path) -> None:
    """The last of two keys is not silently taken: a reviewer and the server would read different
    reasons (and an extra key could hide behind a repeated one)."""

    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        bodies_ = {
            "challenges": b'{"level": "audited", "level": null}',
            "audit": b'{"reason": "looked at it", "reason": "rubber-stamped"}',
            "revoke": b'{"reason": "x", "reason": "y"}',
            "runner-keys": json.dumps(BODY_ENDPOINTS["runner-keys"].valid).encode()[:-1] + b', "kind": "root"}',
        }
        for name, body in bodies_.items():
            assert "duplicate object key" in _error(await site.send(name, body), 400, "bad_request"), name
        site.unchanged()

    h.run(go())


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe\xfa", b'{"reason": "\xe9"}', b"\xc3", b'{"reason": "\xed\xa0\x80"}', b"\xef\xbb\xbf{}"],
    ids=["bytes", "latin1", "cut", "utf8-surrogate", "bom"],
)
def test_body_that_is_not_utf8_json_is_400(world: h.World, tmp_path: Path, body: bytes) -> None:
    _each_endpoint(world, tmp_path, body, 400, "bad_request", "the body")


@pytest.mark.parametrize("body", [b'{"reason": "\\ud800"}', b'{"reason": "\\udfff\\ud800"}'], ids=["lone", "swapped"])
def test_body_with_a_lone_surrogate_escape_is_400(world: h.World, tmp_path: Path, body: bytes) -> None:
    _each_endpoint(world, tmp_path, body, 400, "bad_request", "the body")


@pytest.mark.parametrize(
    "body", [b"[]", b'"reason"', b"1", b"null", b"true", b"[{}]", b"NaN", b'{"reason": NaN}', b"{} {}"]
)
def test_body_that_is_not_one_json_object_is_400(world: h.World, tmp_path: Path, body: bytes) -> None:
    _each_endpoint(world, tmp_path, body, 400, "bad_request", "the body")


def test_body_over_the_cap_is_413(world: h.World, tmp_path: Path) -> None:
    """A valid object one byte over the cap: refused for its size alone, whatever it holds."""
    prefix = b'{"reason": "'
    big = prefix + b"x" * (bodies.MAX_JSON_BODY - len(prefix) - 1) + b'"}'
    assert len(big) == bodies.MAX_JSON_BODY + 1
    _each_endpoint(world, tmp_path, big, 413, "too_large", str(bodies.MAX_JSON_BODY))


def test_body_declared_over_the_cap_is_413_before_it_is_read(world: h.World, tmp_path: Path) -> None:
    """``Content-Length`` says 1 GiB and nothing is ever sent: the answer comes anyway."""

    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        for name, ep in BODY_ENDPOINTS.items():
            headers = {**JSON, **site.v.auth(ep.user), "Content-Length": str(1 << 30)}
            conn = site.v.client.request(ep.path.format(sub=site.sub), method="POST", headers=headers)
            async with conn:
                await conn.send(b"{")
                deadline = time.monotonic() + 30
                while conn.status_code is None and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                assert conn.status_code == 413, name
                await conn.disconnect()
        site.unchanged()

    h.run(go())


def test_every_valid_body_fits_the_cap() -> None:
    """The cap never refuses a valid body: its longest strings, every character \\u-escaped."""
    longest = "\U0001f511" * bodies.MAX_TEXT
    for model in (bodies.LevelChange, bodies.RunnerKey):
        body = {a.name: longest for a in attrs.fields(model)}
        assert len(json.dumps(body, ensure_ascii=True).encode()) <= bodies.MAX_JSON_BODY


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "application/json; charset=latin-1",
        "application/jsonx",
        "text/json",
    ],
)
def test_body_of_another_media_type_is_415(world: h.World, tmp_path: Path, content_type: str) -> None:
    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        for name, ep in BODY_ENDPOINTS.items():
            body = json.dumps(ep.valid).encode()
            message = _error(await site.send(name, body, {"Content-Type": content_type}), 415, "unsupported_media_type")
            assert "application/json" in message
        site.unchanged()

    h.run(go())


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=UTF-8", "APPLICATION/JSON"])
def test_json_media_type_spellings_are_taken(world: h.World, tmp_path: Path, content_type: str) -> None:
    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        body = json.dumps(BODY_ENDPOINTS["runner-keys"].valid).encode()
        reply = await site.send("runner-keys", body, {"Content-Type": content_type})
        assert reply.status == 201, reply.body
        assert (await site.send("challenges", b"{}", {"Content-Type": content_type})).status == 201

    h.run(go())


def test_multipart_form_upload_is_415_and_records_nothing(world: h.World, tmp_path: Path) -> None:
    """A bundle sent as a form (``curl -F``) is not taken for the bundle's bytes."""

    async def go() -> None:
        site = Site(world, tmp_path)
        form = b'--x\r\nContent-Disposition: form-data; name="file"; filename="b.ale"\r\n\r\n'
        for content_type, body in [
            ("multipart/form-data; boundary=x", form + world.bundles["plain"] + b"\r\n--x--\r\n"),
            ("application/x-www-form-urlencoded", b"bundle=" + world.bundles["plain"][:100]),
            ("application/json", b"{}"),
        ]:
            reply = await site.v.upload(body, headers={"Content-Type": content_type})
            assert "application/octet-stream" in _error(reply, 415, "unsupported_media_type")
        assert _submission_count(site.v) == 0
        plain = await site.v.upload(world.bundles["plain"], headers={"Content-Type": "application/octet-stream"})
        assert plain.status == 201

    h.run(go())


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", None),
        (b"  ", None),
        (b"{}", None),
        (b'{"level": "audited"}', "self_elevation"),
        (b'{"officially_verified": true}', "self_elevation"),
        (b'{"nonce": "00"}', "unknown_field"),
        (b"not json", "bad_request"),
        (b"[]", "bad_request"),
    ],
)
def test_challenge_body_is_empty_or_an_empty_object(
    world: h.World, tmp_path: Path, body: bytes, reason: str | None
) -> None:
    """A challenge request carries nothing: a body that claims a level or sets a field is refused
    rather than ignored (as its query string is)."""

    async def go() -> None:
        site = Site(world, tmp_path)
        reply = await site.v.post("/api/v1/challenges", user=h.PARTICIPANT, data=body, headers=JSON)
        if reason is None:
            assert reply.status == 201, reply.body
        else:
            _error(reply, 400, reason)

    h.run(go())


@pytest.mark.parametrize(
    ("name", "body", "says"),
    [
        ("audit", {}, "required field missing @ $.reason"),
        ("audit", {"reason": 5}, "$.reason"),
        ("audit", {"reason": " "}, "reason must be a non-empty string"),
        ("audit", {"reason": ["x"]}, "$.reason"),
        ("runner-keys", {"public_key": KEY, "kind": "root", "label": "x"}, "kind is one of"),
        ("runner-keys", {"public_key": "QUFB", "kind": "benchmark_team", "label": "x"}, "32 bytes"),
        ("runner-keys", {"public_key": KEY, "kind": "benchmark_team", "label": None}, "$.label"),
    ],
)
def test_body_field_faults_are_named(world: h.World, tmp_path: Path, name: str, body: Any, says: str) -> None:
    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        assert says in _error(await site.send(name, json.dumps(body).encode()), 400, "bad_request")
        site.unchanged()

    h.run(go())


def test_openapi_request_bodies_are_the_models() -> None:
    """The document's request schemas and the attrs models name the same fields, all required,
    nothing else allowed; and the document states the body errors."""
    document = openapi.document("http://x")
    operations = {
        ("/api/v1/operator/submissions/{submission_id}/audit", "post"): bodies.LevelChange,
        ("/api/v1/operator/submissions/{submission_id}/revoke", "post"): bodies.LevelChange,
        ("/api/v1/operator/runner-keys", "post"): bodies.RunnerKey,
        ("/api/v1/challenges", "post"): bodies.NoBody,
    }
    for (path, method), model in operations.items():
        op = document["paths"][path][method]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        names = [a.name for a in attrs.fields(model)]
        assert sorted(schema.get("properties", {})) == sorted(names), path
        assert sorted(schema.get("required", [])) == sorted(names), path
        assert schema["additionalProperties"] is False
        assert {"400", "413", "415"} <= set(op["responses"]), path
    upload = document["paths"]["/api/v1/submissions"]["post"]
    assert {"413", "415"} <= set(upload["responses"])


# -- path and query parameters, headers ------------------------------------------------------------

HOSTILE_IDS = ["x" * (1 << 20), "x" * 65, "sub_é", "sub_\u202e", "..", "sub_\x00", "sub x", "sub_;drop", "%2e%2e", "~"]


@pytest.mark.parametrize("hostile", HOSTILE_IDS, ids=lambda s: repr(s[:12]) + f"-{len(s)}")
def test_hostile_path_ids_are_404_not_500(world: h.World, tmp_path: Path, hostile: str) -> None:
    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        calls = [
            ("GET", f"/api/v1/submissions/{hostile}", None, {}),
            ("POST", f"/api/v1/operator/submissions/{hostile}/audit", h.OPERATOR, {"json": {"reason": "x"}}),
            ("POST", f"/api/v1/operator/submissions/{hostile}/revoke", h.OPERATOR, {"json": {"reason": "x"}}),
            ("DELETE", f"/api/v1/operator/runner-keys/{hostile}", h.OPERATOR, {}),
        ]
        for method, path, user, kw in calls:
            _error(await site.v.call(method, path, user=user, **kw), 404, "not_found")
        site.unchanged()

    h.run(go())


@pytest.mark.parametrize(
    "query",
    [
        "category=open&category=overall",
        "category=" + "x" * (1 << 20),
        "category=%ff%fe",
        "category=%00",
        "category=open%00",
        "category",
        "=open",
        "category=open&" + "x=1&" * 10_000,
    ],
    ids=["repeated", "huge", "not-utf8", "nul", "nul-suffix", "no-value", "no-name", "many"],
)
def test_hostile_leaderboard_query_is_400_not_500(world: h.World, tmp_path: Path, query: str) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        _error(await v.get(f"/api/v1/leaderboard?{query}"), 400, "bad_request")

    h.run(go())


@pytest.mark.parametrize(
    "query",
    ["level=audited&level=audited", "x" * (1 << 16), "%ff=1", "a=%00", "=" * 100, "level"],
    ids=["repeated-level", "huge-name", "not-utf8", "nul", "only-equals", "bare-level"],
)
def test_hostile_challenge_and_upload_queries_are_400_not_500(world: h.World, tmp_path: Path, query: str) -> None:
    async def go() -> None:
        site = Site(world, tmp_path)
        challenge = await site.v.post(f"/api/v1/challenges?{query}", user=h.PARTICIPANT)
        assert challenge.status == 400
        assert challenge.reason in ("self_elevation", "unknown_field")
        upload = await site.v.upload(world.bundles["plain"], query=query)
        assert upload.status == 400
        assert upload.reason in ("self_elevation", "unknown_field")
        assert _submission_count(site.v) == 0

    h.run(go())


@pytest.mark.parametrize(
    "authorization",
    [
        "garbage",
        "Bearer",
        "Bearer ",
        "Bearer " + "A" * (1 << 20),
        "Bearer ale_" + "é" * 100,
        "Bearer \x7f\x01",
        "Basic dXNlcjpwYXNz",
        "bearer ale_lowercase_scheme",
        "Bearer a Bearer b",
        ", ".join(["Bearer x"] * 1000),
    ],
    ids=["garbage", "bare", "empty", "huge", "latin1", "control", "basic", "lowercase", "two", "many"],
)
def test_hostile_authorization_is_401_not_500(world: h.World, tmp_path: Path, authorization: str) -> None:
    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        headers = {"Authorization": authorization, **JSON}
        for name, ep in BODY_ENDPOINTS.items():
            reply = await site.v.post(ep.path.format(sub=site.sub), data=b"{}", headers=headers)
            _error(reply, 401, "unauthenticated")
            assert name
        _error(await site.v.post("/api/v1/submissions", data=b"x", headers=headers), 401, "unauthenticated")
        _error(await site.v.post("/auth/tokens", headers=headers), 401, "unauthenticated")
        site.unchanged()

    h.run(go())


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", " 12", "0", "9" * 30])
def test_hostile_content_length_is_4xx_not_500(world: h.World, tmp_path: Path, length: str) -> None:
    """A ``Content-Length`` that is not a number is ignored (the bytes read decide); a huge one is 413."""

    async def go() -> None:
        site = await Site(world, tmp_path).setup()
        headers = {**JSON, "Content-Length": length}
        for name in BODY_ENDPOINTS:
            reply = await site.send(name, b'{"x": 1}', headers)
            assert (reply.status, reply.reason) in ((400, "unknown_field"), (413, "too_large")), name
            assert (reply.status == 413) == (length == "9" * 30), name
        site.unchanged()

    h.run(go())


def test_docs_state_the_input_limits() -> None:
    """docs/verifier.md gives the limits the code enforces."""
    from ale_verify import _routes_auth, _web

    text = (Path(__file__).resolve().parents[1] / "docs" / "verifier.md").read_text()
    section = text.split("### Request bodies, parameters and headers", 1)[1].split("\n## ", 1)[0]
    assert f"{bodies.MAX_JSON_BODY} bytes (128 KiB)" in section
    assert bodies.MAX_JSON_BODY == 128 * 1024
    assert f"deeper than **{bodies.MAX_JSON_DEPTH}**" in section
    assert f"over-{bodies.MAX_TEXT}-character" in section
    assert f"{_web.MAX_AUTHORIZATION} characters or more" in section
    assert f"`code` over {_routes_auth.MAX_OAUTH_CODE} characters" in section
    assert _routes_auth.MAX_PROVIDER_REPLY == 1 << 20
    assert "up to 1 MiB" in section
    assert _web.PATH_ID.pattern == "[A-Za-z0-9_-]{1,64}"
    assert "at most 64 characters of `A-Z a-z 0-9 _ -`" in section
    assert openapi.ID_SCHEMA["pattern"] == f"^{_web.PATH_ID.pattern}$"


# -- the OAuth provider's replies ---------------------------------------------------------------


@attrs.define
class Provider:
    """A GitHub stand-in whose replies are whatever the test sets."""

    url: str = ""
    token_body: bytes = b'{"access_token": "gho_x", "token_type": "bearer"}'
    user_body: bytes = b'{"login": "octocat"}'
    seen: list[str] = attrs.Factory(list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                provider.seen.append(f"POST {self.path} {length}")
                self.rfile.read(length)
                self._send(provider.token_body)

            def do_GET(self) -> None:
                provider.seen.append(f"GET {self.path}")
                self._send(provider.user_body)

        return Handler


@pytest.fixture
def provider() -> Iterator[Provider]:
    fake = Provider()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(10)


def _oauth_site(world: h.World, tmp: Path, provider: Provider) -> h.Verifier:
    return h.Verifier(
        world,
        tmp,
        github_client_id="Iv1.test",
        github_client_secret="secret",
        github_authorize_url=f"{provider.url}/authorize",
        github_token_url=f"{provider.url}/token",
        github_user_url=f"{provider.url}/user",
    )


async def _callback(v: h.Verifier, code: str) -> h.Reply:
    login = await v.get("/auth/login")
    assert login.status == 302
    state = parse_qs(urlsplit(login.headers["Location"]).query)["state"][0]
    return await v.get(f"/auth/callback?state={state}&code={code}")


DEEP = b"[" * 200_000 + b"]" * 200_000
LOGIN = b'{"login": "octocat"}'


@pytest.mark.parametrize(
    ("token_body", "user_body"),
    [
        (DEEP, LOGIN),
        (b'{"access_token": "gho_x", "access_token": "gho_y"}', LOGIN),
        (b'{"access_token": "gho_x", "n": ' + b"9" * 5000 + b"}", LOGIN),
        (b'{"access_token": "gho_x", "pad": "' + b"x" * (2 << 20) + b'"}', LOGIN),
        (b'{"access_token": "gho_x"}', DEEP),
        (b'{"access_token": "gho_x"}', b'{"login": "a", "login": "b"}'),
        (b'{"access_token": "gho_x"}', b'{"login": "\xff"}'),
    ],
    ids=["token-deep", "token-duplicate", "token-huge-int", "token-huge", "user-deep", "user-duplicate", "user-bytes"],
)
def test_provider_reply_that_is_hostile_json_is_502_not_500(
    world: h.World, tmp_path: Path, provider: Provider, token_body: bytes, user_body: bytes
) -> None:
    async def go() -> None:
        v = _oauth_site(world, tmp_path, provider)
        provider.token_body, provider.user_body = token_body, user_body
        _error(await _callback(v, "abc"), 502, "oauth_failed")
        _error(await v.get("/auth/whoami"), 401, "unauthenticated")
        await v.assert_healthy()

    h.run(go())


def test_oauth_callback_with_a_huge_code_is_400_before_the_provider_is_asked(
    world: h.World, tmp_path: Path, provider: Provider
) -> None:
    async def go() -> None:
        v = _oauth_site(world, tmp_path, provider)
        _error(await _callback(v, "c" * (1 << 20)), 400, "bad_request")
        assert provider.seen == []
        assert (await _callback(v, "abc")).status == 302  # a code of the usual size still logs in
        assert provider.seen[0].startswith("POST /token")

    h.run(go())


# -- the challenge token's payload ----------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(key: bytes, payload: bytes) -> str:
    """A token the server's key really signed, over any payload."""
    part = _b64(payload)
    token = f"v1.{part}.{_b64(hmac.new(key, f'v1.{part}'.encode(), hashlib.sha256).digest())}"
    assert len(token) <= 2048  # past that a token is refused before its payload is read
    return token


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 700 + b"]" * 700,
        b'{"cid": "c", "cid": "d", "exp": 9999999999, "nonce": "n", "sub": "u"}',
        b'{"cid": "c", "exp": ' + b"9" * 1000 + b', "nonce": "n", "sub": "u"}',
        b'{"cid": 1, "exp": 9999999999, "nonce": "n", "sub": "u"}',
        b'{"cid": "c", "exp": true, "nonce": "n", "sub": "u"}',
        b'{"cid": "c", "exp": 9999999999, "nonce": ["n"], "sub": "u"}',
        b'{"cid": "c", "exp": 9999999999, "nonce": "n", "sub": "u", "level": "audited"}',
        b"\xff",
        b"[]",
    ],
    ids=["700-deep", "duplicate", "huge-int", "cid-int", "exp-bool", "nonce-list", "extra", "bytes", "list"],
)
def test_token_payload_that_is_hostile_json_is_token_invalid(payload: bytes) -> None:
    """Even a payload under a genuine signature (a leaked key, a bug that signs what it should not)
    is parsed by the bounded parser into its typed form, or refused as ``token_invalid``."""
    key = b"k" * 32
    with pytest.raises(tokens.TokenError) as caught:
        tokens.verify(key, _signed(key, payload), now=0)
    assert caught.value.reason == "token_invalid"


def test_token_round_trip_is_typed() -> None:
    key = b"k" * 32
    token = tokens.issue(key, challenge_id="chl_1", nonce="ab", user_id="u", expires_at=100.7)
    assert tokens.decode(key, token, now=50) == tokens.TokenPayload(cid="chl_1", exp=100, nonce="ab", sub="u")
    assert tokens.verify(key, token, now=50) == {"cid": "chl_1", "exp": 100, "nonce": "ab", "sub": "u"}
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(key, token, now=101)


# -- the fuzz target ------------------------------------------------------------------------------

CONTENT_TYPES = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "text/plain", "multipart/form-data; boundary=z", ""]
)
FIELDS = st.sampled_from(["reason", "public_key", "kind", "label", "level", "status", "audited", "x", ""])
SHAPED = st.dictionaries(FIELDS, json_values, max_size=4).map(lambda d: json.dumps(d).encode())
HOSTILE_BODIES = st.one_of(
    hostile_json,
    SHAPED,
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda b, cut: b[:cut], SHAPED, st.integers(0, 40)),
)
EXPECTED = {
    "challenges": {201, 400, 413, 415},
    "audit": {400, 409, 413, 415},  # the submission was rejected: a valid body gets 409
    "revoke": {400, 409, 413, 415},
    "runner-keys": {201, 400, 409, 413, 415},
}


@pytest.fixture(scope="module")
def fuzz_site(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> Site:
    return h.run(Site(world, tmp_path_factory.mktemp("inputs-fuzz")).setup())


@pytest.mark.fuzz
@pytest.mark.parametrize("name", list(BODY_ENDPOINTS))
def test_fuzz_hostile_bodies_get_a_clear_4xx(fuzz_site: Site, name: str) -> None:
    """Random, mutated and hostile bodies under random media types: every answer is one of the
    endpoint's documented statuses with a JSON error (or its success), never a 500, and a body
    that is not exactly valid changes nothing."""

    @fuzz_settings
    @given(body=HOSTILE_BODIES, content_type=CONTENT_TYPES)
    def fuzz(body: bytes, content_type: str) -> None:
        headers = {"Content-Type": content_type} if content_type else {}
        keys_before = db.runner_keys(fuzz_site.v.settings.database)
        reply = h.run(fuzz_site.send(name, body, headers))
        assert reply.status in EXPECTED[name], (reply.status, body[:80], reply.body[:200])
        if reply.status >= 400:
            assert reply.reason, reply.body[:200]
            if name == "runner-keys":
                assert db.runner_keys(fuzz_site.v.settings.database) == keys_before
        assert db.get_submission(fuzz_site.v.settings.database, fuzz_site.sub)["level"] is None

    fuzz()
    fuzz_site.v.replies.clear()
