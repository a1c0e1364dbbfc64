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
    "required": ["id", "status", "level", "reason", "reasons", "received_at", "run_id", "summary", "history"],
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["accepted", "rejected"]},
        "level": LEVEL,
        "reason": REJECTION_REASON,
        "reasons": REASONS,
        "received_at": {"type": "number"},
        "run_id": {"type": ["string", "null"]},
        "summary": {"type": "object"},
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
            "schemas": {"Error": ERROR, "Submission": SUBMISSION, "Verdict": VERDICT},
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
