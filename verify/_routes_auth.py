"""GitHub OAuth (authorization-code flow with a ``state``), the session, API tokens."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlencode

import httpx
from quart import Blueprint, redirect, request, session

from ale.core.parse import ParseError, parse_json
from ale_verify import db
from ale_verify._web import ApiError, authenticated, run_db, state
from ale_verify.config import Settings

bp = Blueprint("auth", __name__, url_prefix="/auth")
#: An authorization code longer than this is not one (GitHub's are 20 characters).
MAX_OAUTH_CODE = 512
#: The provider's replies are small objects; a longer one is refused unread past this.
MAX_PROVIDER_REPLY = 1 << 20
MAX_PROVIDER_FIELD = 4096


class ProviderError(Exception):
    """The provider answered something that is not a small JSON document."""


@bp.get("/login")
async def login() -> Any:
    settings = state().settings
    if not settings.github_client_id:
        raise ApiError(404, "not_configured", "GitHub login is not configured on this site")
    oauth_state = secrets.token_urlsafe(24)
    session["oauth_state"] = oauth_state
    query = urlencode(
        {
            "client_id": settings.github_client_id,
            "redirect_uri": f"{settings.public_url}/auth/callback",
            "state": oauth_state,
            "scope": "read:user",
        }
    )
    return redirect(f"{settings.github_authorize_url}?{query}")


@bp.get("/callback")
async def callback() -> Any:
    expected = session.pop("oauth_state", None)
    given = str(request.args.get("state", "")).encode("utf-8", "surrogatepass")
    if not expected or not secrets.compare_digest(given, str(expected).encode()):
        raise ApiError(400, "bad_state", "the OAuth state does not match this browser's login")
    code = request.args.get("code")
    if not code or len(code) > MAX_OAUTH_CODE:
        raise ApiError(400, "bad_request", f"the provider sent no code (of at most {MAX_OAUTH_CODE} characters)")
    settings = state().settings
    login_name = await _github_login(settings, code)
    user = f"github:{login_name}"
    await run_db(db.upsert_user, settings.database, user, login_name, "github")
    session["user"] = user
    return redirect("/auth/whoami")


@bp.get("/whoami")
async def whoami() -> Any:
    user = session.get("user")
    if not user:
        raise ApiError(401, "unauthenticated", "not logged in")
    return {"user": user, "operator": user in state().settings.operators}


@bp.post("/tokens")
@authenticated
async def new_token(user: str) -> Any:
    token = await run_db(db.create_api_token, state().settings.database, user, "created on the site")
    return {"token": token, "user": user}, 201


@bp.post("/logout")
async def logout() -> Any:
    session.clear()
    return {"logged_out": True}


async def _provider_json(client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
    """The provider's JSON reply (None unless 200), read at most :data:`MAX_PROVIDER_REPLY` bytes
    and parsed with the project's bounded parser; ``ProviderError`` for anything else."""
    async with client.stream(method, url, **kw) as reply:
        if reply.status_code != 200:
            return None
        received = bytearray()
        async for chunk in reply.aiter_bytes():
            received += chunk
            if len(received) > MAX_PROVIDER_REPLY:
                raise ProviderError(f"the provider's reply is over {MAX_PROVIDER_REPLY} bytes")
    try:
        return parse_json(bytes(received), what="the provider's reply", max_bytes=MAX_PROVIDER_REPLY)
    except ParseError as exc:
        raise ProviderError(str(exc)) from None


def _field(body: Any, name: str, max_length: int) -> str | None:
    value = body.get(name) if isinstance(body, dict) else None
    ok = isinstance(value, str) and 0 < len(value) <= max_length
    return value if ok else None


async def _github_login(settings: Settings, code: str) -> str:
    """Exchange the code for a token and the token for a login; 502 oauth_failed on any misstep."""
    redirect_uri = f"{settings.public_url}/auth/callback"
    form = {"client_id": settings.github_client_id, "client_secret": settings.github_client_secret,
            "code": code, "redirect_uri": redirect_uri}  # fmt: skip
    accept = {"Accept": "application/json"}
    try:
        async with httpx.AsyncClient(timeout=15) as client:
            token_body = await _provider_json(client, "POST", settings.github_token_url, data=form, headers=accept)
            access = _field(token_body, "access_token", MAX_PROVIDER_FIELD)
            if access is None:
                raise ApiError(502, "oauth_failed", "the provider did not grant an access token")
            headers = {**accept, "Authorization": f"Bearer {access}"}
            user_body = await _provider_json(client, "GET", settings.github_user_url, headers=headers)
    except (httpx.HTTPError, ProviderError):
        raise ApiError(502, "oauth_failed", "the provider could not be reached or answered nonsense") from None
    login_name = _field(user_body, "login", 100)
    if login_name is None:
        raise ApiError(502, "oauth_failed", "the provider did not return a user")
    return login_name
