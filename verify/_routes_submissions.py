"""A participant's side: challenges and uploads."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from quart import Blueprint, request

from ale_verify import db, tokens
from ale_verify._web import ApiError, authenticated, refuse_fields, run_db, state
from ale_verify.bodies import (
    NoBody,
    check_media_type,
    json_body,
    new_spool,
    refuse_declared_over,
    spool_capped,
    spool_in_thread,
)
from ale_verify.pipeline import Outcome, process_upload
from ale_verify.workers import Ticket

bp = Blueprint("submissions", __name__)
BUNDLE_MEDIA_TYPE = "application/octet-stream"


@bp.post("/api/v1/challenges")
@authenticated
async def new_challenge(user: str) -> Any:
    refuse_fields(request.args, what="parameters (this endpoint takes none)")
    await json_body(NoBody, empty_ok=True)
    s = state()
    settings = s.settings
    if not await run_db(db.take_rate, settings.database, user, "challenge", settings.challenges_per_hour):
        raise ApiError(429, "rate_limited", f"at most {settings.challenges_per_hour} challenges an hour")
    row = await run_db(db.create_challenge, settings.database, user, settings.challenge_ttl_s)
    token = tokens.issue(
        s.signing_key, challenge_id=row["id"], nonce=row["nonce"], user_id=user, expires_at=row["expires_at"]
    )
    return {"challenge_id": row["id"], "nonce": row["nonce"], "token": token, "expires_at": row["expires_at"]}, 201


def _verdict(outcome: Outcome, public_url: str) -> tuple[dict[str, Any], int]:
    body = {
        "id": outcome.submission_id,
        "status": outcome.status,
        "level": outcome.level,
        "reason": outcome.reason,
        "reasons": outcome.reasons,
        "url": f"{public_url}/api/v1/submissions/{outcome.submission_id}",
    }
    return body, 201 if outcome.status == "accepted" else 422


@bp.post("/api/v1/submissions")
@authenticated
async def upload(user: str) -> Any:
    s = state()
    settings = s.settings
    refuse_fields(request.args, what="parameters")
    check_media_type(BUNDLE_MEDIA_TYPE)
    refuse_declared_over(settings.max_upload_bytes)
    ticket = s.admission.admit()  # 503 verifier_busy (Retry-After) before anything is read or counted
    try:
        spool = await spool_in_thread(functools.partial(_take_upload, settings, user))
        if spool is None:
            raise ApiError(429, "rate_limited", f"at most {settings.uploads_per_hour} uploads an hour")
        path = await spool_capped(settings.max_upload_bytes, settings.tmp_dir, spool)  # 1. (413 past the cap)
        if path is None:
            raise ApiError(400, "empty_upload", "the body must be the bundle's bytes")
    except BaseException:
        ticket.release()
        raise
    if s.pool is None:
        outcome = await asyncio.get_running_loop().run_in_executor(None, _in_process, s, path, user, ticket)
    else:  # steps 2-13 on a worker; it stores the verdict and deletes the file whatever becomes of this request
        outcome = await asyncio.wrap_future(s.pool.submit(path, user_id=user, now=time.time(), ticket=ticket))
    return _verdict(outcome, settings.public_url)


def _take_upload(settings: Any, user: str) -> tuple[int, str] | None:
    """The upload's take of the user's rate limit, then (allowed) its file: one thread's errand."""
    if not db.take_rate(settings.database, user, "upload", settings.uploads_per_hour):
        return None
    return new_spool(settings.tmp_dir)


def _in_process(s: Any, path: Any, user: str, ticket: Ticket) -> Outcome:
    try:
        return process_upload(path, s.settings, s.signing_key, user_id=user)
    finally:
        ticket.release()
