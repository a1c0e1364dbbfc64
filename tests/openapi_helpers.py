"""Answers validated against the served OpenAPI document's schemas (JSON Schema 2020-12)."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from ale_verify import openapi

DOCUMENT = openapi.document("http://127.0.0.1:8000")


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator of ``schema`` whose ``#/components/...`` references resolve in the document."""
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema", "components": DOCUMENT["components"],
            "allOf": [schema]}  # fmt: skip
    return Draft202012Validator(root)


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Where ``instance`` breaks ``schema`` (a JSON path and the validator's message each); [] when it holds."""
    errors = validator(schema).iter_errors(instance)
    return [f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}" for e in errors]
