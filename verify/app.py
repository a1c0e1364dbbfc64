"""The verifier's HTTP API (Quart). Blocking work (SQLite, decryption, checks) runs in threads.

Errors are JSON: ``{"error": {"reason": "<stable code>", "message": "..."}}``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import tempfile
from collections.abc import Awaitable, Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx
import pyrage
from ale_verify import __version__, db, openapi, tokens
from ale_verify.chain_workers import ChainWorkers
from ale_verify.config import Settings
from ale_verify.pipeline import ELEVATION_FIELDS, process_upload, site_identity
from quart import Quart, Response, jsonify, redirect, request, session
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def error_response(status: int, reason: str, message: str) -> Response:
    response = jsonify({"error": {"reason": reason, "message": message}})
    response.status_code = status
    return response


async def run_db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.to_thread(fn, *args, **kwargs)


def public_submission(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "status": row["status"],
        "level": row["level"],
        "reason": row["reason"],
        "reasons": row["reasons"],
        "received_at": row["received_at"],
        "run_id": row["run_id"],
        "summary": row["summary"],
        "history": [
            {k: h[k] for k in ("at", "actor", "action", "from_level", "to_level", "reason")}
            for h in row.get("history", [])
        ],
    }


def leaderboard_rows(rows: list[dict[str, Any]], category: str) -> list[dict[str, Any]]:
    """Accepted submissions ranked by their category score; revoked ones kept, marked, unranked."""
    out = []
    for row in rows:
        summary = row["summary"]
        score = (summary.get("categories") or {}).get(category)
        if score is None:
            continue
        out.append(
            {
                "submission_id": row["id"],
                "agent": summary["agent"]["name"],
                "model": summary["agent"]["declared"].get("model"),
                "effort": summary["agent"]["declared"].get("effort"),
                "score": score,
                "pass_rate": summary.get("pass_rate"),
                "covered": len(summary.get("covered", [])),
                "required": len(summary.get("covered", [])) + len(summary.get("missing", [])),
                "level": row["level"],
                "received_at": row["received_at"],
            }
        )
    ranked = sorted((r for r in out if r["level"] != "revoked"), key=lambda r: (-r["score"], r["received_at"]))
    for rank, r in enumerate(ranked, start=1):
        r["rank"] = rank
    revoked = [dict(r, rank=None) for r in out if r["level"] == "revoked"]
    return ranked + revoked


def create_app(settings: Settings) -> Quart:
    app = Quart("ale_verify")
    signing_key = settings.signing_key_file.read_bytes()
    recipient = str(pyrage.x25519.Identity.from_str(site_identity(settings)).to_public())
    app.secret_key = signing_key  # signs the session cookie (OAuth state, login)
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax", MAX_CONTENT_LENGTH=None)
    db.migrate(settings.database)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    workers = ChainWorkers(settings.check_processes) if settings.check_processes > 0 else None

    @app.before_serving
    async def _start_workers() -> None:
        if workers is not None:
            await asyncio.to_thread(workers.warm)

    @app.after_serving
    async def _stop_workers() -> None:
        if workers is not None:
            await asyncio.to_thread(workers.close)

    @app.errorhandler(ApiError)
    async def _api_error(exc: ApiError) -> Response:
        return error_response(exc.status, exc.reason, exc.message)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        reason = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(code, "bad_request")
        return error_response(code, reason, exc.description or exc.name)

    @app.errorhandler(Exception)
    async def _bug(exc: Exception) -> Response:
        log.exception("internal error")
        return error_response(500, "internal_error", "internal error; the operator has the details in the log")

    def authenticated(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            header = request.headers.get("Authorization", "")
            user = None
            if header.startswith("Bearer ") and len(header) < 512:
                user = await run_db(db.user_for_token, settings.database, header[7:].strip())
            elif session.get("user"):
                user = session["user"]
            if user is None:
                raise ApiError(
                    401, "unauthenticated", "log in (GitHub) or send an API token: Authorization: Bearer ..."
                )
            return await fn(user, *args, **kwargs)

        return wrapper

    def operator(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @authenticated
        @wraps(fn)
        async def wrapper(user: str, *args: Any, **kwargs: Any) -> Any:
            if user not in settings.operators:
                raise ApiError(403, "forbidden", "this operation is for the site's operators")
            return await fn(user, *args, **kwargs)

        return wrapper

    async def json_body(*, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        try:
            data = await request.get_json(force=True, silent=True)
        except (UnicodeDecodeError, ValueError):
            data = None
        if not isinstance(data, dict):
            raise ApiError(400, "bad_request", "the body must be a JSON object")
        unknown = set(data) - set(required) - set(optional)
        if unknown & ELEVATION_FIELDS:
            raise ApiError(400, "self_elevation", "levels are assigned by the verifier, not by requests")
        if unknown:
            raise ApiError(400, "unknown_field", f"unknown fields: {', '.join(sorted(unknown))}")
        for key in required:
            if not isinstance(data.get(key), str) or not data[key].strip() or len(data[key]) > 2000:
                raise ApiError(400, "bad_request", f"{key} must be a non-empty string (at most 2000 characters)")
        return data

    # -- public API ----------------------------------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"status": "ok", "version": __version__}

    @app.get("/api/v1/openapi.json")
    async def openapi_document() -> Any:
        return openapi.document(settings.public_url)

    @app.get("/api/v1/submission-key")
    async def submission_key() -> Any:
        return {"recipient": recipient, "format": "age-x25519", "max_upload_bytes": settings.max_upload_bytes}

    @app.post("/api/v1/challenges")
    @authenticated
    async def new_challenge(user: str) -> Any:
        if request.args:
            raise ApiError(400, "unknown_field", "this endpoint takes no parameters")
        if not await run_db(db.take_rate, settings.database, user, "challenge", settings.challenges_per_hour):
            raise ApiError(429, "rate_limited", f"at most {settings.challenges_per_hour} challenges an hour")
        row = await run_db(db.create_challenge, settings.database, user, settings.challenge_ttl_s)
        token = tokens.issue(
            signing_key, challenge_id=row["id"], nonce=row["nonce"], user_id=user, expires_at=row["expires_at"]
        )
        return {"challenge_id": row["id"], "nonce": row["nonce"], "token": token, "expires_at": row["expires_at"]}, 201

    @app.post("/api/v1/submissions")
    @authenticated
    async def upload(user: str) -> Any:
        fields = set(request.args)
        if fields & ELEVATION_FIELDS:
            raise ApiError(400, "self_elevation", "levels are assigned by the verifier, not by uploads")
        if fields:
            raise ApiError(400, "unknown_field", f"unknown fields: {', '.join(sorted(fields))}")
        declared = request.content_length
        if declared is not None and declared > settings.max_upload_bytes:
            raise ApiError(413, "too_large", f"the upload limit is {settings.max_upload_bytes} bytes")
        if not await run_db(db.take_rate, settings.database, user, "upload", settings.uploads_per_hour):
            raise ApiError(429, "rate_limited", f"at most {settings.uploads_per_hour} uploads an hour")
        received = bytearray()
        async for chunk in request.body:
            received += chunk
            if len(received) > settings.max_upload_bytes:
                raise ApiError(413, "too_large", f"the upload limit is {settings.max_upload_bytes} bytes")
        if not received:
            raise ApiError(400, "empty_upload", "the body must be the bundle's bytes")
        path = await asyncio.to_thread(_spool, settings.tmp_dir, bytes(received))
        del received
        outcome = await asyncio.to_thread(process_upload, path, settings, signing_key, user_id=user, workers=workers)
        body = {
            "id": outcome.submission_id,
            "status": outcome.status,
            "level": outcome.level,
            "reason": outcome.reason,
            "reasons": outcome.reasons,
            "url": f"{settings.public_url}/api/v1/submissions/{outcome.submission_id}",
        }
        return body, 201 if outcome.status == "accepted" else 422

    @app.get("/api/v1/submissions/<submission_id>")
    async def get_submission(submission_id: str) -> Any:
        if len(submission_id) > 64:
            raise ApiError(404, "not_found", "no such submission")
        row = await run_db(db.get_submission, settings.database, submission_id)
        if row is None:
            raise ApiError(404, "not_found", "no such submission")
        return public_submission(row)

    @app.get("/api/v1/leaderboard")
    async def leaderboard() -> Any:
        category = request.args.get("category", "overall")
        if category not in ("overall", "reproduction", "open") or set(request.args) - {"category"}:
            raise ApiError(400, "bad_request", "category is one of overall, reproduction, open")
        rows = await run_db(db.ranked_submissions, settings.database)
        return {"category": category, "rows": leaderboard_rows(rows, category)}

    # -- operator API --------------------------------------------------------------------------

    async def _change(user: str, submission_id: str, *, action: str, to_level: str, allowed: tuple[str, ...]) -> Any:
        body = await json_body(required=("reason",))
        try:
            row = await run_db(
                db.change_level,
                settings.database,
                submission_id,
                actor=user,
                action=action,
                to_level=to_level,
                reason=body["reason"],
                allowed_from=allowed,
            )
        except KeyError:
            raise ApiError(404, "not_found", "no such submission") from None
        except db.Conflict as exc:
            raise ApiError(409, "conflict", str(exc)) from None
        return public_submission(row)

    @app.post("/api/v1/operator/submissions/<submission_id>/audit")
    @operator
    async def audit(user: str, submission_id: str) -> Any:
        return await _change(
            user, submission_id, action="audited", to_level="audited", allowed=("self_reported", "validated")
        )

    @app.post("/api/v1/operator/submissions/<submission_id>/revoke")
    @operator
    async def revoke(user: str, submission_id: str) -> Any:
        return await _change(
            user,
            submission_id,
            action="revoked",
            to_level="revoked",
            allowed=("self_reported", "validated", "audited", "officially_verified"),
        )

    @app.get("/api/v1/operator/runner-keys")
    @operator
    async def list_runner_keys(user: str) -> Any:
        return {"keys": await run_db(db.runner_keys, settings.database)}

    @app.post("/api/v1/operator/runner-keys")
    @operator
    async def add_runner_key(user: str) -> Any:
        import base64
        import binascii

        from ale.core.signing import key_id

        body = await json_body(required=("public_key", "kind", "label"))
        if body["kind"] not in db.RUNNER_KINDS:
            raise ApiError(400, "bad_request", f"kind is one of {', '.join(db.RUNNER_KINDS)}")
        try:
            raw = base64.b64decode(body["public_key"], validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ApiError(400, "bad_request", "public_key is a base64 raw Ed25519 public key (32 bytes)")
        try:
            await run_db(
                db.register_runner_key,
                settings.database,
                key_id=key_id(raw),
                public_key=body["public_key"],
                kind=body["kind"],
                label=body["label"],
                actor=user,
            )
        except db.Conflict as exc:
            raise ApiError(409, "conflict", str(exc)) from None
        return {"key_id": key_id(raw)}, 201

    @app.delete("/api/v1/operator/runner-keys/<key_id>")
    @operator
    async def retire_key(user: str, key_id: str) -> Any:
        try:
            await run_db(db.retire_runner_key, settings.database, key_id)
        except KeyError:
            raise ApiError(404, "not_found", "no such active runner key") from None
        return {"key_id": key_id, "retired": True}

    # -- GitHub OAuth (authorization-code flow) --------------------------------------------------

    @app.get("/auth/login")
    async def login() -> Any:
        if not settings.github_client_id:
            raise ApiError(404, "not_configured", "GitHub login is not configured on this site")
        state = secrets.token_urlsafe(24)
        session["oauth_state"] = state
        query = urlencode(
            {
                "client_id": settings.github_client_id,
                "redirect_uri": f"{settings.public_url}/auth/callback",
                "state": state,
                "scope": "read:user",
            }
        )
        return redirect(f"{settings.github_authorize_url}?{query}")

    @app.get("/auth/callback")
    async def callback() -> Any:
        state = session.pop("oauth_state", None)
        given = str(request.args.get("state", "")).encode("utf-8", "surrogatepass")
        if not state or not secrets.compare_digest(given, str(state).encode()):
            raise ApiError(400, "bad_state", "the OAuth state does not match this browser's login")
        code = request.args.get("code")
        if not code:
            raise ApiError(400, "bad_request", "the provider sent no code")
        login_name = await _github_login(settings, code)
        user = f"github:{login_name}"
        await run_db(db.upsert_user, settings.database, user, login_name, "github")
        session["user"] = user
        return redirect("/auth/whoami")

    @app.get("/auth/whoami")
    async def whoami() -> Any:
        user = session.get("user")
        if not user:
            raise ApiError(401, "unauthenticated", "not logged in")
        return {"user": user, "operator": user in settings.operators}

    @app.post("/auth/tokens")
    @authenticated
    async def new_token(user: str) -> Any:
        token = await run_db(db.create_api_token, settings.database, user, "created on the site")
        return {"token": token, "user": user}, 201

    @app.post("/auth/logout")
    async def logout() -> Any:
        session.clear()
        return {"logged_out": True}

    return app


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


def _spool(tmp_dir: Path, data: bytes) -> Path:
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=".ale", dir=tmp_dir)
    with open(fd, "wb") as fh:
        fh.write(data)
    return Path(name)
