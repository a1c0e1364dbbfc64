"""Public reads: health, the OpenAPI document, the submission key, a submission, the leaderboard."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request

from ale import catalog
from ale_verify import __version__, db, judging, openapi, ranking
from ale_verify._web import ApiError, run_db, state

bp = Blueprint("public", __name__)
CATEGORIES = ranking.CATEGORIES


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
        "judgements": judging.task_judgements(row["summary"]) if row["status"] == "accepted" else {},
        "history": [
            {k: h[k] for k in ("at", "actor", "action", "from_level", "to_level", "reason")}
            for h in row.get("history", [])
        ],
    }


def _board_row(row: dict[str, Any], category: str, score: float, specs: dict[str, Any]) -> dict[str, Any]:
    summary = row["summary"]
    declared = summary["agent"]["declared"]
    covered, required = ranking.coverage(summary, category, specs)
    stored = ranking.stored_bounds(ranking.summary_interval(summary, category=category))
    return {
        "submission_id": row["id"],
        "agent": summary["agent"]["name"],
        "model": declared.get("model"),
        "effort": declared.get("effort"),
        "score": score,
        "lower": stored[0] if stored is not None else None,
        "upper": stored[1] if stored is not None else None,
        "pass_rate": summary.get("pass_rate"),
        "covered": covered,
        "required": required,
        "complete": ranking.complete((covered, required)),
        "level": row["level"],
        "received_at": row["received_at"],
    }


def leaderboard_rows(rows: list[dict[str, Any]], category: str) -> list[dict[str, Any]]:
    """Accepted submissions in board order with their ranks (:mod:`ale_verify.ranking`: complete
    runs first; runs whose 95% intervals cannot tell them apart share a rank); revoked ones kept,
    marked, unranked."""
    specs = {t.spec.ref: t.spec for t in catalog.tasks().values()}
    out = []
    for row in rows:
        score = (row["summary"].get("categories") or {}).get(category)
        if score is not None:
            out.append(_board_row(row, category, score, specs))
    standing = [r for r in out if r["level"] != "revoked"]
    placed = ranking.place([_standing(r) for r in standing])
    ranked = [dict(standing[i], rank=rank) for i, rank in placed]
    revoked = sorted(
        (dict(r, rank=None) for r in out if r["level"] == "revoked"),
        key=lambda r: (r["received_at"], r["submission_id"]),
    )
    return ranked + revoked


def _standing(r: dict[str, Any]) -> ranking.Standing:
    lower, upper = ranking.bounds(r["score"], {"lower": r["lower"], "upper": r["upper"]})
    return ranking.Standing(r["score"], lower, upper, r["complete"], r["received_at"], r["submission_id"])


@bp.get("/healthz")
async def healthz() -> Any:
    return {"status": "ok", "version": __version__}


@bp.get("/api/v1/openapi.json")
async def openapi_document() -> Any:
    return openapi.document(state().settings.public_url)


@bp.get("/api/v1/submission-key")
async def submission_key() -> Any:
    s = state()
    return {"recipient": s.recipient, "format": "age-x25519", "max_upload_bytes": s.settings.max_upload_bytes}


@bp.get("/api/v1/submissions/<submission_id>")
async def get_submission(submission_id: str) -> Any:
    row = await run_db(db.get_submission, state().settings.database, submission_id)
    if row is None:
        raise ApiError(404, "not_found", "no such submission")
    return public_submission(row)


@bp.get("/api/v1/leaderboard")
async def leaderboard() -> Any:
    given = request.args.getlist("category") or ["overall"]
    category = given[0]
    if category not in CATEGORIES or len(given) > 1 or set(request.args) - {"category"}:
        raise ApiError(400, "bad_request", "one category, one of overall, reproduction, open")
    rows = await run_db(db.ranked_submissions, state().settings.database)
    return {"category": category, "rows": leaderboard_rows(rows, category)}
