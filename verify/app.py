"""The verifier's HTTP API (Quart). Blocking work (the database, decryption, checks) runs in threads.

Errors are JSON: ``{"error": {"reason": "<stable code>", "message": "..."}}``. The routes are
blueprints, one module each (``_routes_public``, ``_routes_submissions``, ``_routes_operator``,
``_routes_auth``); :func:`create_app` only wires the configuration, the database, the shared
:class:`~ale_verify._web.AppState`, the blueprints and the error handlers.
"""

from __future__ import annotations

import asyncio
import logging

import pyrage
from quart import Quart, Response
from werkzeug.exceptions import HTTPException

from ale_verify import db, judging
from ale_verify._routes_auth import bp as auth_bp
from ale_verify._routes_operator import bp as operator_bp
from ale_verify._routes_public import bp as public_bp
from ale_verify._routes_public import leaderboard_rows, public_submission
from ale_verify._routes_submissions import bp as submissions_bp
from ale_verify._web import STATE_KEY, ApiError, AppState, check_path_ids, error_response, state
from ale_verify.config import Settings
from ale_verify.judge_worker import JudgeWorker
from ale_verify.pipeline import site_identity
from ale_verify.workers import RETRY_AFTER_S, Admission, Busy, UploadPool

__all__ = ["ApiError", "create_app", "leaderboard_rows", "public_submission"]

log = logging.getLogger(__name__)
BLUEPRINTS = (public_bp, submissions_bp, operator_bp, auth_bp)
HTTP_REASONS = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type"}


def create_app(settings: Settings) -> Quart:
    app = Quart("ale_verify", static_folder=None)  # no file route: every route is the API (openapi.py)
    signing_key = settings.signing_key_file.read_bytes()
    app.secret_key = signing_key  # signs the session cookie (OAuth state, login)
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax", MAX_CONTENT_LENGTH=None)
    db.migrate(settings.database)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    app.extensions[STATE_KEY] = AppState(
        settings=settings,
        signing_key=signing_key,
        recipient=str(pyrage.x25519.Identity.from_str(site_identity(settings)).to_public()),
        admission=Admission(settings.max_pending_uploads),
        pool=UploadPool(settings, signing_key, settings.workers) if settings.workers > 0 else None,
        judge_worker=JudgeWorker(settings) if judging.configured(settings) else None,
    )
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.url_value_preprocessor(check_path_ids)
    app.before_serving(_start_workers)
    app.after_serving(_stop_workers)
    app.register_error_handler(db.Unavailable, _database_unavailable)
    app.register_error_handler(Busy, _busy)
    app.register_error_handler(db.Unstorable, _unstorable)
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _bug)
    return app


async def _start_workers() -> None:
    s = state()
    if s.judge_worker is not None:
        s.judge_worker.start()


async def _stop_workers() -> None:
    await close(state())


async def close(s: AppState) -> None:
    """Stop the judge worker, let the upload workers finish their uploads and stop them (uploads
    are refused from then on: 503 verifier_busy), close the database pool."""
    if s.judge_worker is not None:
        await asyncio.to_thread(s.judge_worker.stop)
    if s.pool is not None:
        await asyncio.to_thread(s.pool.close)
    await asyncio.to_thread(db.close, s.settings.database)


async def _database_unavailable(exc: db.Unavailable) -> Response:
    log.error("%s", exc)  # the operator's detail; the client is told only that it is unavailable
    response = error_response(503, "database_unavailable", "the database is unavailable; try again later")
    response.headers["Retry-After"] = str(int(db.WAIT_S))
    return response


async def _busy(exc: Busy) -> Response:
    response = error_response(503, "verifier_busy", f"{exc}; try again later")
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


async def _unstorable(exc: db.Unstorable) -> Response:
    return error_response(400, "bad_request", str(exc))


async def _api_error(exc: ApiError) -> Response:
    return error_response(exc.status, exc.reason, exc.message)


async def _http_error(exc: HTTPException) -> Response:
    code = exc.code or 500
    return error_response(code, HTTP_REASONS.get(code, "bad_request"), exc.description or exc.name)


async def _bug(exc: Exception) -> Response:
    log.exception("internal error")
    return error_response(500, "internal_error", "internal error; the operator has the details in the log")
