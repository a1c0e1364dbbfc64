"""The published JSON Schemas of the bundle's files (draft 2020-12), and a validator over them.

The pure core takes the validator as a function, so it stays free of file reading.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jsonschema

DOCUMENTS = {
    "manifest.json": "manifest",
    "task_results.json": "task_results",
    "score_breakdown.json": "score_breakdown",
    "faithfulness.json": "faithfulness",
    "network_summary.json": "network_summary",
    "artifacts_manifest.json": "artifacts_manifest",
    "integrity.json": "integrity",
}


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((resources.files("ale") / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def validate_document(file_name: str, document: Any) -> None:
    """Raise ValueError naming the first schema violation of a bundle file."""
    v = validator(DOCUMENTS[file_name])
    error = jsonschema.exceptions.best_match(v.iter_errors(document))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise ValueError(f"{file_name} at {where}: {error.message[:300]}")
