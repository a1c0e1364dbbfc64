"""GitHub OAuth (authorization-code flow) against a local fake provider on 127.0.0.1: login, the
session, API tokens made from it, operators, and every way the flow can go wrong."""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import attrs
import httpx
import pytest
import verifier_helpers as h

CLIENT_ID = "Iv1.testclient"
CLIENT_SECRET = "fake-client-secret-" + secrets.token_hex(8)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


@attrs.define
class FakeGitHub:
    """Just enough of github.com's OAuth endpoints and api.github.com/user."""

    url: str = ""
    next_login: str = "octocat"
    token_mode: str = "ok"  # ok | refuse | html | list
    user_mode: str = "ok"  # ok | no_login | error | html
    codes: dict[str, str] = attrs.Factory(dict)
    access: dict[str, str] = attrs.Factory(dict)
    requests: list[tuple[str, str, dict[str, Any]]] = attrs.Factory(list)

    def reset(self) -> None:
        self.next_login, self.token_mode, self.user_mode = "octocat", "ok", "ok"
        self.requests.clear()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                fake.requests.append(("GET", parts.path, {**query, "authorization": self.headers.get("Authorization")}))
                if parts.path == "/login/oauth/authorize":
                    if query.get("client_id") != CLIENT_ID:
                        self._send(400, b'{"error":"unknown client"}')
                        return
                    code = secrets.token_hex(10)
                    fake.codes[code] = fake.next_login
                    back = f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query.get('state', '')})}"
                    self._send(302, b"", "text/plain", Location=back)
                elif parts.path == "/user":
                    token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    login = fake.access.get(token)
                    if login is None or fake.user_mode == "error":
                        self._send(401, b'{"message":"Bad credentials"}')
                    elif fake.user_mode == "html":
                        self._send(200, b"<html>rate limited</html>", "text/html")
                    elif fake.user_mode == "no_login":
                        self._send(200, json.dumps({"id": 1}).encode())
                    else:
                        self._send(200, json.dumps({"login": login, "id": 1}).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                fake.requests.append(("POST", self.path, form))
                if self.path != "/login/oauth/access_token":
                    self._send(404, b"{}")
                    return
                login = fake.codes.pop(form.get("code", ""), None)
                ok = form.get("client_id") == CLIENT_ID and form.get("client_secret") == CLIENT_SECRET
                if fake.token_mode == "html":
                    self._send(200, b"<html>oops</html>", "text/html")
                elif fake.token_mode == "list":
                    self._send(200, b"[]")
                elif login is None or not ok or fake.token_mode == "refuse":
                    self._send(200, b'{"error":"bad_verification_code"}')  # GitHub answers 200 here
                else:
                    token = "gho_" + secrets.token_hex(12)
                    fake.access[token] = login
                    self._send(200, json.dumps({"access_token": token, "token_type": "bearer"}).encode())

        return Handler


@pytest.fixture(scope="module")
def github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def fake(github: FakeGitHub) -> FakeGitHub:
    github.reset()
    return github


def _site(world: h.World, tmp: Path, fake: FakeGitHub, **overrides: Any) -> h.Verifier:
    settings: dict[str, Any] = {
        "github_client_id": CLIENT_ID,
        "github_client_secret": CLIENT_SECRET,
        "github_authorize_url": f"{fake.url}/login/oauth/authorize",
        "github_token_url": f"{fake.url}/login/oauth/access_token",
        "github_user_url": f"{fake.url}/user",
        "public_url": "http://127.0.0.1:8123",
    }
    settings.update(overrides)
    return h.Verifier(world, tmp, **settings)


def _check_no_client_secret(v: h.Verifier) -> None:
    for reply in v.replies:
        assert CLIENT_SECRET.encode() not in reply.body
        assert CLIENT_SECRET not in str(reply.headers)


async def _start(v: h.Verifier, fake: FakeGitHub) -> str:
    """GET /auth/login; the browser follows to the provider, which sends it back: return that URL."""
    login = await v.get("/auth/login")
    assert login.status == 302
    location = login.headers["Location"]
    assert location.startswith(f"{fake.url}/login/oauth/authorize?")
    query = parse_qs(urlsplit(location).query)
    assert query["client_id"] == [CLIENT_ID]
    assert query["redirect_uri"] == [f"{v.settings.public_url}/auth/callback"]
    assert len(query["state"][0]) >= 16
    assert CLIENT_SECRET not in location
    async with httpx.AsyncClient(timeout=10) as browser:
        at_provider = await browser.get(location, follow_redirects=False)
    assert at_provider.status_code == 302
    back = at_provider.headers["location"]
    assert back.startswith(f"{v.settings.public_url}/auth/callback?")
    return back


def _path(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


async def _login(v: h.Verifier, fake: FakeGitHub, name: str) -> h.Reply:
    fake.next_login = name
    callback = await v.get(_path(await _start(v, fake)))
    assert callback.status == 302, callback.body
    assert callback.headers["Location"].endswith("/auth/whoami")
    return callback


def test_login_session_api_token(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake)
        await _login(v, fake, "octocat")
        whoami = await v.get("/auth/whoami")
        assert whoami.json == {"user": "github:octocat", "operator": False}
        # the token exchange sent the secret to the provider, server to server
        (exchange,) = [r for r in fake.requests if r[0] == "POST"]
        assert exchange[2]["client_secret"] == CLIENT_SECRET
        assert exchange[2]["redirect_uri"] == f"{v.settings.public_url}/auth/callback"
        (user_call,) = [r for r in fake.requests if r[1] == "/user"]
        assert (user_call[2]["authorization"] or "").startswith("Bearer gho_")
        # the session makes an API token
        made = await v.post("/auth/tokens")
        assert made.status == 201
        assert made.json["user"] == "github:octocat"
        token = made.json["token"]
        # which works as a Bearer token, from a client without the session
        other = h.Verifier(world, tmp_path, github_client_id=CLIENT_ID)
        challenge = await other.post("/api/v1/challenges", headers={"Authorization": f"Bearer {token}"})
        assert challenge.status == 201
        assert challenge.json["nonce"]
        upload = await other.post(
            "/api/v1/submissions",
            data=world.bundles["plain"],
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"},
        )
        assert upload.status == 201
        assert upload.json["level"] == "self_reported"
        # but it is not an operator's
        forbidden = await other.get("/api/v1/operator/runner-keys", headers={"Authorization": f"Bearer {token}"})
        assert (forbidden.status, forbidden.reason) == (403, "forbidden")
        forbidden = await v.get("/api/v1/operator/runner-keys")  # nor is the session
        assert (forbidden.status, forbidden.reason) == (403, "forbidden")
        # only the token's hash is stored
        dump = h.dump(v.settings.database)
        assert token not in dump
        assert token[4:] not in dump
        _check_no_client_secret(v)
        _check_no_client_secret(other)

    h.run(go())


def test_operator_login(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake, operators=frozenset({"github:root-op"}))
        await _login(v, fake, "root-op")
        assert (await v.get("/auth/whoami")).json == {"user": "github:root-op", "operator": True}
        assert (await v.get("/api/v1/operator/runner-keys")).status == 200
        token = (await v.post("/auth/tokens")).json["token"]
        await v.post("/auth/logout")
        assert (await v.get("/api/v1/operator/runner-keys")).status == 401
        keys = await v.get("/api/v1/operator/runner-keys", headers={"Authorization": f"Bearer {token}"})
        assert keys.status == 200
        assert keys.json == {"keys": []}

    h.run(go())


def test_state_mismatch(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake)
        back = await _start(v, fake)
        query = {k: v[0] for k, v in parse_qs(urlsplit(back).query).items()}
        forged = await v.get("/auth/callback?" + urlencode({"code": query["code"], "state": "attacker-state"}))
        assert (forged.status, forged.reason) == (400, "bad_state")
        # the state was spent by the failed attempt: the genuine callback now fails too
        late = await v.get(_path(back))
        assert (late.status, late.reason) == (400, "bad_state")
        assert not [r for r in fake.requests if r[0] == "POST"], "no code exchange on a bad state"
        assert (await v.get("/auth/whoami")).status == 401

    h.run(go())


def test_callback_without_login_or_in_another_browser(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        victim = _site(world, tmp_path, fake)
        back = await _start(victim, fake)
        attacker = _site(world, tmp_path / "attacker", fake)
        stolen = await attacker.get(_path(back))
        assert (stolen.status, stolen.reason) == (400, "bad_state")
        assert (await attacker.get("/auth/whoami")).status == 401
        bare = await attacker.get("/auth/callback")
        assert (bare.status, bare.reason) == (400, "bad_state")

    h.run(go())


def test_state_is_single_use(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake)
        back = await _start(v, fake)
        assert (await v.get(_path(back))).status == 302
        again = await v.get(_path(back))
        assert (again.status, again.reason) == (400, "bad_state")

    h.run(go())


def test_missing_code(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake)
        back = await _start(v, fake)
        state = parse_qs(urlsplit(back).query)["state"][0]
        reply = await v.get("/auth/callback?" + urlencode({"state": state, "error": "access_denied"}))
        assert (reply.status, reply.reason) == (400, "bad_request")
        assert (await v.get("/auth/whoami")).status == 401

    h.run(go())


@pytest.mark.parametrize(
    ("token_mode", "user_mode", "overrides"),
    [
        ("refuse", "ok", {}),
        ("ok", "ok", {"github_client_secret": "the wrong secret"}),
        ("ok", "error", {}),
        ("ok", "no_login", {}),
    ],
    ids=["code-refused", "wrong-client-secret", "user-endpoint-error", "user-without-login"],
)
def test_provider_failures_are_502(
    world: h.World, tmp_path: Path, fake: FakeGitHub, token_mode: str, user_mode: str, overrides: dict[str, Any]
) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake, **overrides)
        back = await _start(v, fake)
        fake.token_mode, fake.user_mode = token_mode, user_mode
        reply = await v.get(_path(back))
        assert (reply.status, reply.reason) == (502, "oauth_failed")
        assert (await v.get("/auth/whoami")).status == 401
        assert (await v.post("/auth/tokens")).status == 401
        _check_no_client_secret(v)

    h.run(go())


@pytest.mark.parametrize("mode", ["token-html", "token-list", "user-html", "unreachable"])
def test_provider_misbehaving_is_502_not_500(
    world: h.World, tmp_path: Path, fake: FakeGitHub, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider that answers garbage, or does not answer, is the provider's failure (502), never
    the site's bug (500); and nothing secret reaches the log either way."""
    caplog.set_level(logging.DEBUG)

    async def go() -> None:
        overrides: dict[str, Any] = {}
        if mode == "unreachable":
            port = h.free_port()
            overrides = {"github_token_url": f"http://127.0.0.1:{port}/login/oauth/access_token"}
        v = _site(world, tmp_path, fake, **overrides)
        back = await _start(v, fake)
        fake.token_mode = {"token-html": "html", "token-list": "list"}.get(mode, "ok")
        fake.user_mode = "html" if mode == "user-html" else "ok"
        reply = await v.get(_path(back))
        assert (await v.get("/healthz")).status == 200
        assert (await v.get("/auth/whoami")).status == 401
        assert (reply.status, reply.reason) == (502, "oauth_failed"), reply.body

    try:
        h.run(go())
    finally:
        h.assert_no_secret(world.keys, caplog.text, "the log")
        assert CLIENT_SECRET not in caplog.text


def test_login_not_configured(world: h.World, tmp_path: Path) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path)
        reply = await v.get("/auth/login")
        assert (reply.status, reply.reason) == (404, "not_configured")

    h.run(go())


def test_logout_ends_the_session(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        v = _site(world, tmp_path, fake)
        await _login(v, fake, "leaver")
        assert (await v.get("/auth/whoami")).status == 200
        assert (await v.post("/auth/logout")).json == {"logged_out": True}
        assert (await v.get("/auth/whoami")).status == 401
        reply = await v.post("/auth/tokens")
        assert (reply.status, reply.reason) == (401, "unauthenticated")

    h.run(go())


def test_session_cookie_is_signed(world: h.World, tmp_path: Path, fake: FakeGitHub) -> None:
    async def go() -> None:
        operators = frozenset({"github:root-op"})
        site = _site(world, tmp_path / "site", fake, operators=operators)
        callback = await _login(site, fake, "cookie-eater")
        set_cookie = callback.headers["Set-Cookie"]
        assert "HttpOnly" in set_cookie
        assert "SameSite=Lax" in set_cookie
        value = set_cookie.split(";")[0].split("=", 1)[1]
        browser = _site(world, tmp_path / "site", fake, operators=operators)  # same site, no cookie jar state
        genuine = await browser.get("/auth/whoami", headers={"Cookie": f"session={value}"})
        assert genuine.status == 200
        assert genuine.json["user"] == "github:cookie-eater"
        tampered = value[:-2] + ("AA" if value[-2:] != "AA" else "BB")
        assert (await browser.get("/auth/whoami", headers={"Cookie": f"session={tampered}"})).status == 401
        # a session made by a site with another signing key, for an operator's name
        other_key = tmp_path / "other-signing-key.bin"
        other_key.write_bytes(secrets.token_bytes(32))
        forger = _site(world, tmp_path / "forger", fake, operators=operators, signing_key_file=other_key)
        forged_cb = await _login(forger, fake, "root-op")
        forged = forged_cb.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
        for path in ("/auth/whoami", "/api/v1/operator/runner-keys"):
            reply = await browser.get(path, headers={"Cookie": f"session={forged}"})
            assert (reply.status, reply.reason) == (401, "unauthenticated"), path

    h.run(go())
