"""The OpenAPI 3.1 document the app serves at /api/v1/openapi.json."""

from __future__ import annotations

from typing import Any

from ale.core.bundle import Limits
from ale.core.reasons import Level, Use, reasons_for


def _codes(*uses: Use) -> list[str]:
    return [r.value for use in uses for r in reasons_for(use)]


#: The reason codes and levels of ale.core.reasons, as closed enumerations.
REQUEST_REASON = {"enum": _codes(Use.REQUEST)}
REJECTION_REASON = {"enum": [*_codes(Use.REJECTION), None]}
LISTED_REASON = {"enum": sorted(set(_codes(Use.REJECTION, Use.NOTE)))}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["reason", "message"],
            "properties": {"reason": REQUEST_REASON, "message": {"type": "string"}},
        }
    },
}
LEVEL = {"enum": [*(level.value for level in Level), None]}
REASONS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["reason", "message"],
        "properties": {"reason": LISTED_REASON, "message": {"type": "string"}},
    },
}
SUBMISSION = {
    "type": "object",
    "required": [
        "id",
        "status",
        "level",
        "reason",
        "reasons",
        "received_at",
        "run_id",
        "summary",
        "judgements",
        "history",
    ],
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["accepted", "rejected"]},
        "level": LEVEL,
        "reason": REJECTION_REASON,
        "reasons": REASONS,
        "received_at": {"type": "number"},
        "run_id": {"type": ["string", "null"]},
        "summary": {"type": "object"},
        "judgements": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Judgement"}},
        "history": {"type": "array", "items": {"type": "object"}},
    },
}
VERDICT = {
    "type": "object",
    "required": ["id", "status", "level", "reason", "reasons", "url"],
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["accepted", "rejected"]},
        "level": LEVEL,
        "reason": REJECTION_REASON,
        "reasons": REASONS,
        "url": {"type": "string"},
    },
}


#: A judge key as the operator API gives it (verify/_routes_operator.py).
JUDGE_KEY = {
    "type": "object",
    "required": [
        "key_id",
        "public_key",
        "label",
        "source",
        "registered_at",
        "registered_by",
        "revoked_at",
        "revoked_by",
        "revoke_reason",
        "active",
    ],
    "properties": {
        "key_id": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "public_key": {"type": "string"},
        "label": {"type": "string"},
        "source": {"enum": ["api", "configuration"]},
        "registered_at": {"type": ["number", "null"]},
        "registered_by": {"type": ["string", "null"]},
        "revoked_at": {"type": ["number", "null"]},
        "revoked_by": {"type": ["string", "null"]},
        "revoke_reason": {"type": ["string", "null"]},
        "active": {"type": "boolean"},
    },
}
#: A task's judgement state (ale_verify.judging.task_judgement; docs/leaderboard-export.md).
JUDGEMENT = {
    "type": "object",
    "required": ["state", "judged_by", "judge_key_id", "judge_model", "reason"],
    "properties": {
        "state": {"enum": ["judged_faithful", "judged_unfaithful", "unjudged", "judging_pending"]},
        "judged_by": {"enum": ["judge_key", "verifier", None]},
        "judge_key_id": {"type": ["string", "null"]},
        "judge_model": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
    },
}
#: A raw Ed25519 public key in base64 (32 bytes: 43 characters and one "=").
PUBLIC_KEY = {"type": "string", "pattern": "^[A-Za-z0-9+/]{43}=$", "minLength": 44, "maxLength": 44}
TEXT = {"type": "string", "minLength": 1, "maxLength": 2000}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


AUTH: list[dict[str, list[str]]] = [{"bearer": []}]
#: Path identifiers; any other value is a 404 (verify/_web.py PATH_ID).
ID_SCHEMA = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "maxLength": 64}
ID_PARAM = {"name": "submission_id", "in": "path", "required": True, "schema": ID_SCHEMA}
#: Every JSON body: at most 128 KiB, nesting at most 8 deep, UTF-8, unique keys (verify/bodies.py).
BODY_ERRORS = {
    "413": _error("body over 128 KiB"),
    "415": _error("body not application/json"),
}
REASON_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["reason"],
                "additionalProperties": False,
                "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 2000}},
            }
        }
    },
}


def _level_change(operation: str, conflict: str) -> dict[str, Any]:
    """An operator's level change: a reason in, the submission out."""
    return {
        "post": {
            "operationId": operation,
            "security": AUTH,
            "parameters": [ID_PARAM],
            "requestBody": REASON_BODY,
            "responses": {
                "200": _json({"$ref": "#/components/schemas/Submission"}),
                "400": _error("bad body"),
                "401": _error("no valid token"),
                "403": _error("not an operator"),
                "404": _error("unknown id"),
                "409": _error(conflict),
                **BODY_ERRORS,
            },
        }
    }


#: The operations that read no database: every other one may answer 503 database_unavailable.
WITHOUT_DATABASE = frozenset({"health", "submissionKey"})
#: ... and an upload also 503 verifier_busy (ale_verify.workers.Admission).
BUSY = "; or (verifier_busy) it holds as many uploads as it takes at once"


def document(server_url: str) -> dict[str, Any]:
    doc = _document(server_url)
    for item in doc["paths"].values():
        for operation in item.values():
            if operation["operationId"] not in WITHOUT_DATABASE:
                busy = BUSY if operation["operationId"] == "submit" else ""
                operation["responses"]["503"] = _error(f"the database is unavailable{busy} (try again later)")
    return doc


def _document(server_url: str) -> dict[str, Any]:
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
            "schemas": {
                "Error": ERROR,
                "Submission": SUBMISSION,
                "Verdict": VERDICT,
                "Judgement": JUDGEMENT,
                "JudgeKey": JUDGE_KEY,
            },
        },
        "paths": {
            "/healthz": {"get": {"operationId": "health", "responses": {"200": _json({"type": "object"})}}},
            "/api/v1/submission-key": {
                "get": {
                    "operationId": "submissionKey",
                    "summary": "the site's age X25519 public key",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["recipient", "format", "max_upload_bytes"],
                                "properties": {
                                    "recipient": {"type": "string", "pattern": "^age1"},
                                    "format": {"const": "age-x25519"},
                                    "max_upload_bytes": {"type": "integer"},
                                },
                            }
                        )
                    },
                }
            },
            "/api/v1/challenges": {
                "post": {
                    "operationId": "createChallenge",
                    "security": AUTH,
                    "summary": "a one-time, expiring, server-signed challenge; the run binds its nonce",
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": {"type": "object", "additionalProperties": False}}},
                    },
                    "responses": {
                        "201": _json(
                            {
                                "type": "object",
                                "required": ["challenge_id", "nonce", "token", "expires_at"],
                                "properties": {
                                    "challenge_id": {"type": "string"},
                                    "nonce": {"type": "string"},
                                    "token": {"type": "string"},
                                    "expires_at": {"type": "number"},
                                },
                            },
                            "Created",
                        ),
                        "400": _error("parameters or body fields given"),
                        "401": _error("no valid token"),
                        "429": _error("rate limited"),
                        **BODY_ERRORS,
                    },
                }
            },
            "/api/v1/submissions": {
                "post": {
                    "operationId": "submit",
                    "security": AUTH,
                    "summary": "upload an encrypted bundle (age(zstd(tar))); the verdict comes back at once",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "format": "binary", "maxLength": Limits().max_ciphertext}
                            }
                        },
                    },
                    "responses": {
                        "201": _json({"$ref": "#/components/schemas/Verdict"}, "accepted, with its level"),
                        "422": _json({"$ref": "#/components/schemas/Verdict"}, "rejected, with its reasons"),
                        "400": _error("empty upload or a refused field"),
                        "401": _error("no valid token"),
                        "413": _error("over the size cap"),
                        "415": _error("body not application/octet-stream"),
                        "429": _error("rate limited"),
                    },
                }
            },
            "/api/v1/submissions/{submission_id}": {
                "get": {
                    "operationId": "getSubmission",
                    "parameters": [ID_PARAM],
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Submission"}),
                        "404": _error("unknown id"),
                    },
                }
            },
            "/api/v1/leaderboard": {
                "get": {
                    "operationId": "leaderboard",
                    "parameters": [
                        {
                            "name": "category",
                            "in": "query",
                            "required": False,
                            "schema": {"enum": ["overall", "reproduction", "open"]},
                        }
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["category", "rows"],
                                "properties": {
                                    "category": {"type": "string"},
                                    "rows": {"type": "array", "items": {"type": "object"}},
                                },
                            }
                        ),
                        "400": _error("unknown category"),
                    },
                }
            },
            "/api/v1/operator/submissions/{submission_id}/audit": _level_change("audit", "not allowed from its level"),
            "/api/v1/operator/submissions/{submission_id}/revoke": _level_change(
                "revoke", "already revoked or rejected"
            ),
            "/api/v1/operator/runner-keys": {
                "get": {
                    "operationId": "listRunnerKeys",
                    "security": AUTH,
                    "responses": {
                        "200": _json({"type": "object"}),
                        "401": _error("no valid token"),
                        "403": _error("not an operator"),
                    },
                },
                "post": {
                    "operationId": "registerRunnerKey",
                    "security": AUTH,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["public_key", "kind", "label"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "public_key": {"type": "string", "minLength": 1, "maxLength": 2000},
                                        "label": {"type": "string", "minLength": 1, "maxLength": 2000},
                                        "kind": {
                                            "enum": [
                                                "benchmark_team",
                                                "approved_third_party",
                                                "hardware_attested",
                                                "official_rerun",
                                            ]
                                        },
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "201": _json({"type": "object"}, "registered"),
                        "400": _error("bad body"),
                        "401": _error("no valid token"),
                        "403": _error("not an operator"),
                        "409": _error("already registered"),
                        **BODY_ERRORS,
                    },
                },
            },
            "/api/v1/operator/judge-keys": {
                "get": {
                    "operationId": "listJudgeKeys",
                    "security": AUTH,
                    "summary": "the judge keys: registered here (active or revoked) and the configuration's",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["keys"],
                                "properties": {
                                    "keys": {"type": "array", "items": {"$ref": "#/components/schemas/JudgeKey"}}
                                },
                            }
                        ),
                        "401": _error("no valid token"),
                        "403": _error("not an operator"),
                    },
                },
                "post": {
                    "operationId": "registerJudgeKey",
                    "security": AUTH,
                    "summary": "register a judging party's key: its signed verdicts are credited from now on",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["public_key", "label"],
                                    "additionalProperties": False,
                                    "properties": {"public_key": PUBLIC_KEY, "label": TEXT},
                                }
                            }
                        },
                    },
                    "responses": {
                        "201": _json({"$ref": "#/components/schemas/JudgeKey"}, "registered"),
                        "400": _error("bad body (a public key that is not base64 of 32 bytes, PEM included)"),
                        "401": _error("no valid token"),
                        "403": _error("not an operator"),
                        "409": _error("already registered (here, revoked, or in the configuration)"),
                        **BODY_ERRORS,
                    },
                },
            },
            "/api/v1/operator/judge-keys/{key_id}/revoke": {
                "post": {
                    "operationId": "revokeJudgeKey",
                    "security": AUTH,
                    "summary": "revoke a judge key: every task credited to it is re-scored unjudged (final 0)",
                    "parameters": [{"name": "key_id", "in": "path", "required": True, "schema": ID_SCHEMA}],
                    "requestBody": REASON_BODY,
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["key", "rescored"],
                                "properties": {
                                    "key": {"$ref": "#/components/schemas/JudgeKey"},
                                    "rescored": {"type": "array", "items": {"type": "string"}},
                                },
                            }
                        ),
                        "400": _error("bad body"),
                        "401": _error("no valid token"),
                        "403": _error("not an operator"),
                        "404": _error("unknown key"),
                        "409": _error("already revoked, or a submission it credited cannot be re-scored"),
                        **BODY_ERRORS,
                    },
                }
            },
            "/api/v1/operator/runner-keys/{key_id}": {
                "delete": {
                    "operationId": "retireRunnerKey",
                    "security": AUTH,
                    "parameters": [{"name": "key_id", "in": "path", "required": True, "schema": ID_SCHEMA}],
                    "responses": {
                        "200": _json({"type": "object"}),
                        "401": _error("no valid token"),
                        "403": _error("not an operator"),
                        "404": _error("unknown key"),
                    },
                }
            },
        },
    }
