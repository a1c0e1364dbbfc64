"""The OpenAPI 3.1 document the app serves at /api/v1/openapi.json.

Every request and response body has a complete schema: each object lists its members, all
required, with ``additionalProperties: false`` wherever the server writes exactly those members
(tests/test_api_schemas.py validates real answers against it). The shapes are made by a few named
helpers (:func:`closed`, :func:`nullable`, :func:`ref`, :func:`array`, :func:`mapping`,
:func:`_operation`, :func:`_json_body`, :func:`_query`) so that each is written once. The
components also hold ``leaderboard.json``'s schema (``LeaderboardExport``,
docs/leaderboard-export.md), which no endpoint serves.
"""

from __future__ import annotations

from typing import Any

from ale.core.bundle import Limits
from ale.core.reasons import Level, Use, reasons_for
from ale.core.results import END_CATEGORIES, END_PHASES
from ale_verify.db import JOB_OFFSET_MAX, JOB_PAGE_DEFAULT, JOB_PAGE_MAX, JUDGE_JOB_STATES

Schema = dict[str, Any]


# -- the shapes ------------------------------------------------------------------------------------


def closed(properties: Schema, *, optional: tuple[str, ...] = ()) -> Schema:
    """An object with exactly ``properties``, every one required but ``optional``, nothing else."""
    return {
        "type": "object",
        "required": [name for name in properties if name not in optional],
        "properties": properties,
        "additionalProperties": False,
    }


def nullable(schema: Schema) -> Schema:
    """``schema`` or JSON null (a ``type`` gains ``"null"``; anything else becomes an ``anyOf``)."""
    kind = schema.get("type")
    if isinstance(kind, str) and set(schema) <= {"type", "minimum", "maximum", "pattern", "minLength", "maxLength"}:
        return {**schema, "type": [kind, "null"]}
    if "enum" in schema and set(schema) == {"enum"}:
        return {"enum": [*schema["enum"], None]}
    return {"anyOf": [schema, {"type": "null"}]}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def mapping(values: Schema, keys: Schema | None = None) -> Schema:
    """An object used as a map (any member names, or those of ``keys``), each value ``values``."""
    return {"type": "object", "additionalProperties": values, **({"propertyNames": keys} if keys else {})}


STRING: Schema = {"type": "string"}
NUMBER: Schema = {"type": "number"}
INTEGER: Schema = {"type": "integer"}
COUNT: Schema = {"type": "integer", "minimum": 0}
BOOLEAN: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}  # a document the server passes through as the run wrote it
RATIO: Schema = {"type": "number", "minimum": 0, "maximum": 1}
RANK: Schema = {"type": "integer", "minimum": 1}
SHA256: Schema = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
#: A task reference, ``id@version``.
TASK_REF: Schema = {"type": "string", "pattern": "^[^@]+@[^@]+$"}
TEXT: Schema = {"type": "string", "minLength": 1, "maxLength": 2000}
#: A raw Ed25519 public key in base64 (32 bytes: 43 characters and one "=").
PUBLIC_KEY: Schema = {"type": "string", "pattern": "^[A-Za-z0-9+/]{43}=$", "minLength": 44, "maxLength": 44}
#: Path identifiers; any other value is a 404 (verify/_web.py PATH_ID).
ID_SCHEMA: Schema = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "maxLength": 64}


def _codes(*uses: Use) -> list[str]:
    return [r.value for use in uses for r in reasons_for(use)]


#: The reason codes and levels of ale.core.reasons, as closed enumerations.
REQUEST_REASON: Schema = {"enum": _codes(Use.REQUEST)}
REJECTION_REASON: Schema = nullable({"enum": _codes(Use.REJECTION)})
LISTED_REASON: Schema = {"enum": sorted(set(_codes(Use.REJECTION, Use.NOTE)))}
LEVEL_VALUE: Schema = {"enum": [level.value for level in Level]}
LEVEL: Schema = nullable(LEVEL_VALUE)
CATEGORY: Schema = {"enum": ["overall", "reproduction", "open"]}
GENRE: Schema = {"enum": ["reproduction", "open"]}
RUNNER_KIND: Schema = {"enum": ["benchmark_team", "approved_third_party", "hardware_attested", "official_rerun"]}
JUDGEMENT_STATE: Schema = {"enum": ["judged_faithful", "judged_unfaithful", "unjudged", "judging_pending"]}
JUDGE_JOB_STATE: Schema = {"enum": list(JUDGE_JOB_STATES)}


# -- the components -------------------------------------------------------------------------------

ERROR = closed({"error": closed({"reason": REQUEST_REASON, "message": STRING})})
REASONS = array(closed({"reason": LISTED_REASON, "message": STRING}))
HEALTH = closed({"status": {"const": "ok"}, "version": STRING})
SUBMISSION_KEY = closed(
    {"recipient": {"type": "string", "pattern": "^age1"}, "format": {"const": "age-x25519"}, "max_upload_bytes": COUNT}
)
CHALLENGE = closed(
    {
        "challenge_id": {"type": "string", "pattern": "^chl_[0-9a-f]{24}$"},
        "nonce": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "token": STRING,
        "expires_at": NUMBER,
    }
)
#: A verdict's members; accepted: a level and no reason; rejected: no level, the first failure's code.
_OUTCOME = {
    "if": {"properties": {"status": {"const": "accepted"}}},
    "then": {"properties": {"level": LEVEL_VALUE, "reason": {"const": None}}},
    "else": {"properties": {"level": {"const": None}, "reason": {"enum": _codes(Use.REJECTION)}}},
}
#: What a verdict and a stored submission both say of an upload.
_OUTCOME_MEMBERS: Schema = {
    "id": {"type": "string", "pattern": "^sub_[0-9a-f]{24}$"},
    "status": {"enum": ["accepted", "rejected"]},
    "level": LEVEL,
    "reason": REJECTION_REASON,
    "reasons": REASONS,
}


def _with_outcome(members: Schema) -> Schema:
    """A closed object of the outcome's members and ``members``, held to the outcome's rule."""
    return {**closed({**_OUTCOME_MEMBERS, **members}), **_OUTCOME}


VERDICT = _with_outcome({"url": STRING})
INTERVAL = closed({"lower": NUMBER, "upper": NUMBER})
#: The 95% intervals of a run's credited scores (docs/intervals.md; ale.core.intervals).
INTERVALS = closed(
    {
        "method": STRING,
        "confidence": NUMBER,
        "resamples": COUNT,
        "tasks": mapping(nullable(ref("Interval")), TASK_REF),
        "macro_mean": nullable(ref("Interval")),
        "categories": mapping(nullable(ref("Interval")), CATEGORY),
    }
)
#: A completed task of the summary (ale.core.results.task_score_document, its status and judgement).
COMPLETED_TASK = closed(
    {
        "task": TASK_REF,
        "genre": GENRE,
        "metric": STRING,
        "direction": {"enum": ["higher", "lower"]},
        "measured": NUMBER,
        "paper_value": NUMBER,
        "gap": NUMBER,
        "penalties": mapping(NUMBER),
        "score": NUMBER,
        "faithful": nullable(BOOLEAN),
        "final": NUMBER,
        "episodes": COUNT,
        "passed": COUNT,
        "pass_rate": RATIO,
        "status": {"const": "completed"},
        "judgement": nullable(OBJECT),
    },
    optional=("judgement",),  # stored by verifiers since faithfulness judging
)
#: A task the run did not complete: why, and how it ended (its phase and category, docs/formats.md).
UNCOMPLETED_TASK = closed(
    {
        "task": TASK_REF,
        "genre": GENRE,
        "status": {"const": "not_completed"},
        "reason": STRING,
        "ended": nullable(closed({"phase": {"enum": list(END_PHASES)}, "category": {"enum": list(END_CATEGORIES)}})),
    },
    optional=("ended",),  # stored by verifiers since task endings; null for a bundle that records none
)
#: What the verifier stores of an accepted upload and the board shows (verify/pipeline.py audit_summary).
ACCEPTED_SUMMARY = closed(
    {
        "run_id": STRING,
        "agent": closed({"name": STRING, "declared": OBJECT, "command": array(STRING)}),
        "release": STRING,
        "release_sha256": SHA256,
        "tasks": array({"oneOf": [ref("CompletedTask"), ref("UncompletedTask")]}),
        "macro_mean": nullable(NUMBER),
        "categories": mapping(nullable(NUMBER), CATEGORY),
        "intervals": nullable(ref("Intervals")),
        "pass_rate": nullable(RATIO),
        "covered": array(TASK_REF),
        "missing": array(TASK_REF),
        "coverage_complete": BOOLEAN,
        "task_info": mapping(
            closed({"mode": {"enum": ["interactive", "batch"]}, "genre": GENRE, "official_episodes": COUNT}), TASK_REF
        ),
        "official_episode_counts": BOOLEAN,
        "started": nullable(STRING),
        "finished": nullable(STRING),
        "active_s": nullable({"type": "number", "minimum": 0}),  # the run's active spans (docs/formats.md)
        "usage": nullable(OBJECT),
        "network_proxy": nullable(OBJECT),
        "runtime": nullable(OBJECT),
        "release_images": nullable(mapping(STRING)),
        "image_provenance": nullable(mapping(OBJECT)),
        "challenge_id": nullable(STRING),
        "runner": nullable(closed({"key_id": SHA256, "kind": RUNNER_KIND, "label": STRING})),
        "ciphertext_sha256": SHA256,
        "merkle_root": SHA256,
        "trajectory_events": COUNT,
    },
    # members a later verifier added: a row an older one stored lacks them
    optional=("intervals", "runtime", "release_images", "image_provenance", "active_s"),
)
#: A rejected upload keeps only its ciphertext's digest.
REJECTED_SUMMARY = closed({"ciphertext_sha256": {"type": "string", "pattern": "^([0-9a-f]{64})?$"}})
#: What an entry of a submission's audit history records (verify/pipeline.py, db.change_level, db._apply).
HISTORY_ACTIONS = ("accepted", "rejected", "audited", "revoked", "judged", "rescored")
HISTORY_ENTRY = closed(
    {
        "at": NUMBER,
        "actor": STRING,
        "action": {"enum": list(HISTORY_ACTIONS)},
        "from_level": LEVEL,
        "to_level": LEVEL,
        "reason": STRING,
    }
)
SUBMISSION = _with_outcome(
    {
        "received_at": NUMBER,
        "run_id": nullable(STRING),
        "summary": {"oneOf": [ref("AcceptedSummary"), ref("RejectedSummary")]},
        "judgements": mapping(ref("Judgement"), TASK_REF),
        "history": array(ref("HistoryEntry")),
    }
)
#: A task's judgement state (ale_verify.judging.task_judgement; docs/leaderboard-export.md).
JUDGEMENT = closed(
    {
        "state": JUDGEMENT_STATE,
        "judged_by": {"enum": ["judge_key", "verifier", None]},
        "judge_key_id": nullable(SHA256),
        "judge_model": nullable(STRING),
        "reason": nullable(STRING),
    }
)
#: A row of GET /api/v1/leaderboard (verify/_routes_public.py _board_row, ranked by verify/ranking.py).
LEADERBOARD_ROW = {
    **closed(
        {
            "rank": nullable(RANK),
            "submission_id": STRING,
            "agent": STRING,
            "model": nullable(STRING),
            "effort": nullable(STRING),
            "score": NUMBER,
            "lower": nullable(NUMBER),
            "upper": nullable(NUMBER),
            "pass_rate": nullable(RATIO),
            "covered": COUNT,
            "required": COUNT,
            "complete": BOOLEAN,
            "level": LEVEL_VALUE,
            "received_at": NUMBER,
        }
    ),
    # revoked rows are listed, unranked; every other row has a rank
    "if": {"properties": {"level": {"const": "revoked"}}},
    "then": {"properties": {"rank": {"const": None}}},
    "else": {"properties": {"rank": RANK}},
}
LEADERBOARD = closed({"category": CATEGORY, "rows": array(ref("LeaderboardRow"))})
RUNNER_KEY = closed(
    {
        "key_id": SHA256,
        "public_key": STRING,
        "kind": RUNNER_KIND,
        "label": STRING,
        "registered_at": NUMBER,
        "registered_by": STRING,
        "retired_at": nullable(NUMBER),
    }
)
#: A judge key as the operator API gives it (verify/_routes_operator.py).
JUDGE_KEY = closed(
    {
        "key_id": SHA256,
        "public_key": STRING,
        "label": STRING,
        "source": {"enum": ["api", "configuration"]},
        "registered_at": nullable(NUMBER),
        "registered_by": nullable(STRING),
        "revoked_at": nullable(NUMBER),
        "revoked_by": nullable(STRING),
        "revoke_reason": nullable(STRING),
        "active": BOOLEAN,
    }
)
JUDGE_JOB = closed(
    {
        "submission_id": STRING,
        "task": TASK_REF,
        "state": JUDGE_JOB_STATE,
        "input_sha256": SHA256,
        "attempts": COUNT,
        "not_before": NUMBER,
        "claimed_by": nullable(STRING),
        "lease_until": nullable(NUMBER),
        "outcome": nullable(STRING),
        "last_error": nullable(STRING),
        "queued_at": NUMBER,
        "finished_at": nullable(NUMBER),
        "has_input": BOOLEAN,
    }
)
JUDGE_JOBS = closed(
    {
        "counts": closed({"pending": COUNT, "running": COUNT, "failed": COUNT, "done": COUNT}),
        "oldest_pending_queued_at": nullable(NUMBER),
        "oldest_pending_age_s": nullable({"type": "number", "minimum": 0}),
        "state": nullable(JUDGE_JOB_STATE),
        "limit": {"type": "integer", "minimum": 1},
        "offset": COUNT,
        "total": COUNT,
        "next_offset": nullable(COUNT),
        "jobs": array(ref("JudgeJob")),
    }
)


def _export_row() -> Schema:
    """A row of leaderboard.json (verify/export.py; docs/leaderboard-export.md): every CSV column, typed."""
    per_category = {
        column: schema
        for category in CATEGORY["enum"]
        for column, schema in (
            (f"rank_{category}", nullable(RANK)),
            (f"score_{category}", nullable(NUMBER)),
            (f"lower_{category}", nullable(NUMBER)),
            (f"upper_{category}", nullable(NUMBER)),
        )
    }
    return closed(
        {
            "submission_id": STRING,
            "url": {"type": "string", "pattern": "^submissions/[A-Za-z0-9_-]+\\.html$"},
            "agent": STRING,
            "model": nullable(STRING),
            "effort": nullable(STRING),
            "level": LEVEL_VALUE,
            "revoked": BOOLEAN,
            **per_category,
            "macro_mean": nullable(NUMBER),
            "pass_rate": nullable(RATIO),
            "pass_rate_reproduction": nullable(RATIO),
            "pass_rate_open": nullable(RATIO),
            "covered": COUNT,
            "required": COUNT,
            "coverage_complete": BOOLEAN,
            "missing": array(TASK_REF),
            "runtime_s": nullable(NUMBER),
            "input_tokens": nullable(COUNT),
            "output_tokens": nullable(COUNT),
            "tokens_source": {"enum": ["network_proxy", None]},
            "received_at": {
                "type": "string",
                "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}Z$",
            },
            "started": nullable(STRING),
            "finished": nullable(STRING),
            "release": STRING,
            "official_episode_counts": BOOLEAN,
            "runner_kind": nullable(RUNNER_KIND),
            "run_id": STRING,
            "ciphertext_sha256": SHA256,
            "merkle_root": SHA256,
            **{state: array(TASK_REF) for state in JUDGEMENT_STATE["enum"]},
            "judged_by": array({"type": "string", "pattern": "^[^=]+=(judge_key:[0-9a-f]{64}|verifier:.*)$"}),
            "task_finals": mapping(NUMBER, TASK_REF),
            "task_judgements": mapping(ref("Judgement"), TASK_REF),
        }
    )


LEADERBOARD_EXPORT = closed(
    {
        "schema": {"const": "ale-leaderboard/v1"},
        "release": STRING,
        "cap": NUMBER,
        "required_tasks": array(TASK_REF),
        "submissions": array(ref("LeaderboardExportRow")),
    }
)

SCHEMAS: dict[str, Schema] = {
    "Error": ERROR,
    "Health": HEALTH,
    "SubmissionKey": SUBMISSION_KEY,
    "Challenge": CHALLENGE,
    "Verdict": VERDICT,
    "Submission": SUBMISSION,
    "AcceptedSummary": ACCEPTED_SUMMARY,
    "RejectedSummary": REJECTED_SUMMARY,
    "CompletedTask": COMPLETED_TASK,
    "UncompletedTask": UNCOMPLETED_TASK,
    "Intervals": INTERVALS,
    "Interval": INTERVAL,
    "HistoryEntry": HISTORY_ENTRY,
    "Judgement": JUDGEMENT,
    "Leaderboard": LEADERBOARD,
    "LeaderboardRow": LEADERBOARD_ROW,
    "RunnerKey": RUNNER_KEY,
    "JudgeKey": JUDGE_KEY,
    "JudgeJob": JUDGE_JOB,
    "JudgeJobs": JUDGE_JOBS,
    "LeaderboardExport": LEADERBOARD_EXPORT,
    "LeaderboardExportRow": _export_row(),
}


# -- the operations -------------------------------------------------------------------------------


def _error(description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": ref("Error")}}}


def _json(schema: Schema, description: str = "OK") -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _redirect(description: str) -> Schema:
    return {"description": description, "headers": {"Location": {"schema": STRING, "required": True}}}


def _json_body(schema: Schema, *, required: bool = True) -> Schema:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


AUTH: list[dict[str, list[str]]] = [{"bearer": []}]
ID_PARAM: Schema = {"name": "submission_id", "in": "path", "required": True, "schema": ID_SCHEMA}
KEY_PARAM: Schema = {"name": "key_id", "in": "path", "required": True, "schema": ID_SCHEMA}
#: Every JSON body: at most 128 KiB, nesting at most 8 deep, UTF-8, unique keys (verify/bodies.py).
BODY_ERRORS = {"413": _error("body over 128 KiB"), "415": _error("body not application/json")}
REASON_BODY = _json_body(closed({"reason": TEXT}))


def _operation(
    operation_id: str,
    responses: Schema,
    *,
    auth: str | None = None,
    summary: str | None = None,
    parameters: list[Schema] | None = None,
    body: Schema | None = None,
) -> Schema:
    """One operation; ``auth`` "token" adds the 401, "operator" the 401 and 403, and a JSON
    ``body`` its 400 and the body errors (413, 415) unless ``responses`` says them already."""
    errors: Schema = {}
    if body is not None and "application/json" in body["content"]:
        errors |= {"400": _error("bad body"), **BODY_ERRORS}
    if auth is not None:
        errors["401"] = _error("no valid token")
    if auth == "operator":
        errors["403"] = _error("not an operator")
    op: Schema = {"operationId": operation_id}
    if summary:
        op["summary"] = summary
    if auth is not None:
        op["security"] = AUTH
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    op["responses"] = {**responses, **{k: v for k, v in errors.items() if k not in responses}}
    return op


def _level_change(operation: str, conflict: str) -> Schema:
    """An operator's level change: a reason in, the submission out."""
    return {
        "post": _operation(
            operation,
            {"200": _json(ref("Submission")), "404": _error("unknown id"), "409": _error(conflict)},
            auth="operator",
            parameters=[ID_PARAM],
            body=REASON_BODY,
        )
    }


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


#: The operations that read no database: every other one may answer 503 database_unavailable.
WITHOUT_DATABASE = frozenset({"health", "openapiDocument", "submissionKey", "login", "whoami", "logout"})
#: ... and an upload also 503 verifier_busy (ale_verify.workers.Admission).
BUSY = "; or (verifier_busy) it holds as many uploads as it takes at once"


def document(server_url: str) -> Schema:
    doc = _document(server_url)
    for item in doc["paths"].values():
        for operation in item.values():
            if operation["operationId"] not in WITHOUT_DATABASE:
                busy = BUSY if operation["operationId"] == "submit" else ""
                operation["responses"]["503"] = _error(f"the database is unavailable{busy} (try again later)")
    return doc


def _document(server_url: str) -> Schema:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ALE Robotics verifier",
            "version": "1.0.0",
            "description": "Challenges, encrypted submissions, verification levels and the leaderboard.",
        },
        "servers": [{"url": server_url}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": SCHEMAS,
        },
        "paths": {**_public_paths(), **_submission_paths(), **_operator_paths(), **_auth_paths()},
    }


def _public_paths() -> Schema:
    return {
        "/healthz": {"get": _operation("health", {"200": _json(ref("Health"))})},
        "/api/v1/openapi.json": {
            "get": _operation(
                "openapiDocument",
                {
                    "200": _json(
                        closed(
                            {
                                "openapi": {"const": "3.1.0"},
                                "info": OBJECT,
                                "servers": array(OBJECT),
                                "components": OBJECT,
                                "paths": OBJECT,
                            }
                        )
                    )
                },
                summary="this document",
            )
        },
        "/api/v1/submission-key": {
            "get": _operation(
                "submissionKey", {"200": _json(ref("SubmissionKey"))}, summary="the site's age X25519 public key"
            )
        },
        "/api/v1/submissions/{submission_id}": {
            "get": _operation(
                "getSubmission",
                {"200": _json(ref("Submission")), "404": _error("unknown id")},
                parameters=[ID_PARAM],
            )
        },
        "/api/v1/leaderboard": {
            "get": _operation(
                "leaderboard",
                {"200": _json(ref("Leaderboard")), "400": _error("unknown or repeated category, or another parameter")},
                parameters=[_query("category", CATEGORY, "the board's category (default overall)")],
            )
        },
    }


def _submission_paths() -> Schema:
    return {
        "/api/v1/challenges": {
            "post": _operation(
                "createChallenge",
                {
                    "201": _json(ref("Challenge"), "Created"),
                    "400": _error("parameters or body fields given"),
                    "429": _error("rate limited"),
                },
                auth="token",
                summary="a one-time, expiring, server-signed challenge; the run binds its nonce",
                body=_json_body(closed({}), required=False),
            )
        },
        "/api/v1/submissions": {
            "post": _operation(
                "submit",
                {
                    "201": _json(ref("Verdict"), "accepted, with its level"),
                    "422": _json(ref("Verdict"), "rejected, with its reasons"),
                    "400": _error("empty upload or a refused field"),
                    "413": _error("over the size cap"),
                    "415": _error("body not application/octet-stream"),
                    "429": _error("rate limited"),
                },
                auth="token",
                summary="upload an encrypted bundle (age(zstd(tar))); the verdict comes back at once",
                body={
                    "required": True,
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary", "maxLength": Limits().max_ciphertext}
                        }
                    },
                },
            )
        },
    }


def _operator_paths() -> Schema:
    runner_key_body = closed({"public_key": TEXT, "label": TEXT, "kind": RUNNER_KIND})
    return {
        "/api/v1/operator/submissions/{submission_id}/audit": _level_change("audit", "not allowed from its level"),
        "/api/v1/operator/submissions/{submission_id}/revoke": _level_change("revoke", "already revoked or rejected"),
        "/api/v1/operator/runner-keys": {
            "get": _operation(
                "listRunnerKeys",
                {"200": _json(closed({"keys": array(ref("RunnerKey"))}))},
                auth="operator",
                summary="the trusted runner keys, active and retired, by registration",
            ),
            "post": _operation(
                "registerRunnerKey",
                {"201": _json(closed({"key_id": SHA256}), "registered"), "409": _error("already registered")},
                auth="operator",
                body=_json_body(runner_key_body),
            ),
        },
        "/api/v1/operator/runner-keys/{key_id}": {
            "delete": _operation(
                "retireRunnerKey",
                {
                    "200": _json(closed({"key_id": ID_SCHEMA, "retired": {"const": True}})),
                    "404": _error("unknown key"),
                },
                auth="operator",
                parameters=[KEY_PARAM],
            )
        },
        "/api/v1/operator/judge-keys": {
            "get": _operation(
                "listJudgeKeys",
                {"200": _json(closed({"keys": array(ref("JudgeKey"))}))},
                auth="operator",
                summary="the judge keys: registered here (active or revoked) and the configuration's",
            ),
            "post": _operation(
                "registerJudgeKey",
                {
                    "201": _json(ref("JudgeKey"), "registered"),
                    "400": _error("bad body (a public key that is not base64 of 32 bytes, PEM included)"),
                    "409": _error("already registered (here, revoked, or in the configuration)"),
                },
                auth="operator",
                summary="register a judging party's key: its signed verdicts are credited from now on",
                body=_json_body(closed({"public_key": PUBLIC_KEY, "label": TEXT})),
            ),
        },
        "/api/v1/operator/judge-keys/{key_id}/revoke": {
            "post": _operation(
                "revokeJudgeKey",
                {
                    "200": _json(closed({"key": ref("JudgeKey"), "rescored": array(STRING)})),
                    "404": _error("unknown key"),
                    "409": _error("already revoked, or a submission it credited cannot be re-scored"),
                },
                auth="operator",
                summary="revoke a judge key: every task credited to it is re-scored unjudged (final 0)",
                parameters=[KEY_PARAM],
                body=REASON_BODY,
            )
        },
        "/api/v1/operator/judge-jobs": {
            "get": _operation(
                "listJudgeJobs",
                {
                    "200": _json(ref("JudgeJobs")),
                    "400": _error("a parameter that is not one of these, repeated, or out of its range"),
                },
                auth="operator",
                summary="the verifier's judge jobs: counts by state, the oldest pending one's age, one page of jobs",
                parameters=[
                    _query("state", JUDGE_JOB_STATE, "only the jobs in this state (default: all)"),
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": JOB_PAGE_MAX},
                        f"jobs in the page (default {JOB_PAGE_DEFAULT}); ASCII digits only",
                    ),
                    _query(
                        "offset",
                        {"type": "integer", "minimum": 0, "maximum": JOB_OFFSET_MAX},
                        "jobs skipped, in queue order (default 0); ASCII digits only",
                    ),
                ],
            )
        },
    }


def _auth_paths() -> Schema:
    return {
        "/auth/login": {
            "get": _operation(
                "login",
                {"302": _redirect("to GitHub's authorization page"), "404": _error("GitHub login not configured")},
                summary="start the GitHub OAuth authorization-code flow (a state in the session)",
            )
        },
        "/auth/callback": {
            "get": _operation(
                "oauthCallback",
                {
                    "302": _redirect("logged in: to /auth/whoami"),
                    "400": _error("the state does not match this browser's login, or no code"),
                    "502": _error("the provider could not be reached or answered nonsense"),
                },
                summary="GitHub's redirect back: the code is exchanged for the user's login",
                parameters=[
                    _query("state", {"type": "string"}, "the state /auth/login put in the session"),
                    _query("code", {"type": "string", "maxLength": 512}, "the provider's authorization code"),
                ],
            )
        },
        "/auth/whoami": {
            "get": _operation(
                "whoami",
                {
                    "200": _json(closed({"user": STRING, "operator": BOOLEAN})),
                    "401": _error("not logged in"),
                },
                summary="the login session's user",
            )
        },
        "/auth/tokens": {
            "post": _operation(
                "createToken",
                {"201": _json(closed({"token": STRING, "user": STRING}), "Created")},
                auth="token",
                summary="a new API token (session or token)",
            )
        },
        "/auth/logout": {
            "post": _operation(
                "logout", {"200": _json(closed({"logged_out": {"const": True}}))}, summary="end the login session"
            )
        },
    }
