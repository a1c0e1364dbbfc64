"""The operator API: level changes (audit, revoke), the trusted runner keys and judge keys, the
judge jobs."""

from __future__ import annotations

import base64
import re
import time
from typing import Any

from quart import Blueprint, request

from ale.core import signing
from ale_verify import db, judging
from ale_verify._routes_public import public_submission
from ale_verify._web import ApiError, operator, refuse_fields, run_db, state
from ale_verify.bodies import JudgeKeyBody, LevelChange, Revocation, RunnerKey, json_body

bp = Blueprint("operator", __name__, url_prefix="/api/v1/operator")
#: Where each change may start: audit reviews an accepted, unreviewed submission; revoke ends any.
AUDIT_FROM = ("self_reported", "validated")
REVOKE_FROM = ("self_reported", "validated", "audited", "officially_verified")


async def _change(user: str, submission_id: str, *, action: str, allowed: tuple[str, ...]) -> Any:
    body = await json_body(LevelChange)
    try:
        row = await run_db(
            db.change_level,
            state().settings.database,
            submission_id,
            actor=user,
            action=action,
            to_level=action,
            reason=body.reason,
            allowed_from=allowed,
        )
    except KeyError:
        raise ApiError(404, "not_found", "no such submission") from None
    except db.Conflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return public_submission(row)


@bp.post("/submissions/<submission_id>/audit")
@operator
async def audit(user: str, submission_id: str) -> Any:
    return await _change(user, submission_id, action="audited", allowed=AUDIT_FROM)


@bp.post("/submissions/<submission_id>/revoke")
@operator
async def revoke(user: str, submission_id: str) -> Any:
    return await _change(user, submission_id, action="revoked", allowed=REVOKE_FROM)


@bp.get("/runner-keys")
@operator
async def list_runner_keys(user: str) -> Any:
    return {"keys": await run_db(db.runner_keys, state().settings.database)}


@bp.post("/runner-keys")
@operator
async def add_runner_key(user: str) -> Any:
    body = await json_body(RunnerKey)
    key_id = signing.key_id(body.raw)
    try:
        await run_db(
            db.register_runner_key,
            state().settings.database,
            key_id=key_id,
            public_key=body.public_key,
            kind=body.kind,
            label=body.label,
            actor=user,
        )
    except db.Conflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return {"key_id": key_id}, 201


@bp.delete("/runner-keys/<key_id>")
@operator
async def retire_key(user: str, key_id: str) -> Any:
    try:
        await run_db(db.retire_runner_key, state().settings.database, key_id)
    except KeyError:
        raise ApiError(404, "not_found", "no such active runner key") from None
    return {"key_id": key_id, "retired": True}


# -- judge keys (docs/verifier.md, "Faithfulness") ----------------------------------------------

#: What the API says of a judge key (the database's row, or a configuration key not recorded there).
JUDGE_KEY_FIELDS = ("key_id", "public_key", "label", "source", "registered_at", "registered_by", "revoked_at",
                    "revoked_by", "revoke_reason")  # fmt: skip


def _judge_key(row: dict[str, Any]) -> dict[str, Any]:
    return {**{k: row.get(k) for k in JUDGE_KEY_FIELDS}, "active": row.get("revoked_at") is None}


def _judge_key_rows() -> list[dict[str, Any]]:
    """The database's judge keys, then the configuration's that it has no row for."""
    settings = state().settings
    rows = db.judge_keys(settings.database)
    known = {r["key_id"] for r in rows}
    configured = [
        {"key_id": k.key_id, "public_key": k.public_key, "label": k.label, "source": "configuration"}
        for k in judging.config_keys(settings).values()
        if k.key_id not in known
    ]
    return [_judge_key(r) for r in rows + sorted(configured, key=lambda r: r["key_id"])]


@bp.get("/judge-keys")
@operator
async def list_judge_keys(user: str) -> Any:
    return {"keys": await run_db(_judge_key_rows)}


@bp.post("/judge-keys")
@operator
async def add_judge_key(user: str) -> Any:
    body = await json_body(JudgeKeyBody)
    settings = state().settings
    key_id = signing.key_id(body.raw)
    if key_id in judging.config_keys(settings):
        raise ApiError(409, "conflict", "this judge key is registered in the configuration (ALE_VERIFY_JUDGE_KEYS)")
    public = base64.b64encode(body.raw).decode()  # the spelling verdicts carry
    try:
        row = await run_db(db.register_judge_key, settings.database, key_id=key_id, public_key=public,
                           label=body.label, actor=user)  # fmt: skip
    except db.Conflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    return _judge_key(row), 201


@bp.post("/judge-keys/<key_id>/revoke")
@operator
async def revoke_judge_key(user: str, key_id: str) -> Any:
    body = await json_body(Revocation)
    settings = state().settings
    found = judging.config_keys(settings).get(key_id)
    configured = None if found is None else {"public_key": found.public_key, "label": found.label}
    try:
        row, rescored = await run_db(db.revoke_judge_key, settings.database, key_id, actor=user, reason=body.reason,
                                     configured=configured, rescore=judging.after_revocation)  # fmt: skip
    except KeyError:
        raise ApiError(404, "not_found", "no such judge key") from None
    except db.Conflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except judging.RescoreError as exc:
        raise ApiError(
            409, "conflict", f"the key stays active: a submission it credited cannot be re-scored: {exc}"
        ) from None
    return {"key": _judge_key(row), "rescored": rescored}


# -- judge jobs (docs/verifier.md, "Judge jobs") -------------------------------------------------

#: A query integer: ASCII digits only (no sign, space, exponent or other scripts' digits).
_DIGITS = re.compile(r"[0-9]{1,12}")
JOB_QUERY = ("state", "limit", "offset")


def judge_job_listing(where: db.Where, *, state: str | None, limit: int, offset: int, now: float) -> dict[str, Any]:
    """The judge jobs as ``GET /api/v1/operator/judge-jobs`` and ``ale-verify judge-jobs`` give
    them: the counts by state, the oldest pending job and its age, and one page of jobs."""
    page = db.judge_job_page(where, state=state, limit=limit, offset=offset)
    oldest = page["oldest_pending_queued_at"]
    shown = offset + len(page["jobs"])
    return {
        "counts": page["counts"],
        "oldest_pending_queued_at": oldest,
        "oldest_pending_age_s": None if oldest is None else max(0.0, now - oldest),
        "state": state,
        "limit": limit,
        "offset": offset,
        "total": page["total"],
        "next_offset": shown if shown < page["total"] and page["jobs"] else None,
        "jobs": page["jobs"],
    }


def _one_arg(name: str) -> str | None:
    given = request.args.getlist(name)
    if len(given) > 1:
        raise ApiError(400, "bad_request", f"{name} is given once")
    return given[0] if given else None


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = _one_arg(name)
    if raw is None:
        return default
    if _DIGITS.fullmatch(raw) is None or not low <= int(raw) <= high:
        raise ApiError(400, "bad_request", f"{name} is an integer from {low} to {high} (ASCII digits)")
    return int(raw)


@bp.get("/judge-jobs")
@operator
async def list_judge_jobs(user: str) -> Any:
    refuse_fields(request.args, allowed=JOB_QUERY, what="parameters")
    wanted = _one_arg("state")
    if wanted is not None and wanted not in db.JUDGE_JOB_STATES:
        raise ApiError(400, "bad_request", f"state is one of {', '.join(db.JUDGE_JOB_STATES)}")
    limit = _int_arg("limit", db.JOB_PAGE_DEFAULT, 1, db.JOB_PAGE_MAX)
    offset = _int_arg("offset", 0, 0, db.JOB_OFFSET_MAX)
    return await run_db(judge_job_listing, state().settings.database, state=wanted, limit=limit, offset=offset,
                        now=time.time())  # fmt: skip
