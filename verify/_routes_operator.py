"""The operator API: level changes (audit, revoke) and the trusted runner keys."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ale.core import signing
from ale_verify import db
from ale_verify._routes_public import public_submission
from ale_verify._web import ApiError, operator, run_db, state
from ale_verify.bodies import LevelChange, RunnerKey, json_body

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
