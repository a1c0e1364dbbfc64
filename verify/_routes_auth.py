"""GitHub OAuth (authorization-code flow with a ``state``), the session, API tokens."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlencode

import httpx
from ale_verify import db
from ale_verify._web import ApiError, authenticated, run_db, state
from ale_verify.config import Settings
from quart import Blueprint, redirect, request, session

bp = Blueprint("auth", __name__, url_prefix="/auth")


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
    if not code:
        raise ApiError(400, "bad_request", "the provider sent no code")
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


async def _github_login(settings: Settings, code: str) -> str:
    """Exchange the code for a token and the token for a login; 502 oauth_failed on any misstep."""
    redirect_uri = f"{settings.public_url}/auth/callback"
    form = {"client_id": settings.github_client_id, "client_secret": settings.github_client_secret,
            "code": code, "redirect_uri": redirect_uri}  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=15) as client:
            token_reply = await client.post(
                settings.github_token_url, data=form, headers={"Accept": "application/json"}
            )
            token_body = token_reply.json() if token_reply.status_code == 200 else None
            access = token_body.get("access_token") if isinstance(token_body, dict) else None
            if not isinstance(access, str) or not access:
                raise ApiError(502, "oauth_failed", "the provider did not grant an access token")
            user_reply = await client.get(
                settings.github_user_url, headers={"Authorization": f"Bearer {access}", "Accept": "application/json"}
            )
            user_body = user_reply.json() if user_reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        raise ApiError(502, "oauth_failed", "the provider could not be reached or answered nonsense") from None
    login_name = user_body.get("login") if isinstance(user_body, dict) else None
    if not isinstance(login_name, str) or not login_name or len(login_name) > 100:
        raise ApiError(502, "oauth_failed", "the provider did not return a user")
    return login_name
