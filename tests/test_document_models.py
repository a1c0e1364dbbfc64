"""The attrs models of the bundle's documents (``ale.core.documents``, ``ale.core.results``) and
the published JSON Schemas (``ale/schemas/``) agree: the same members, all required (but those with a
default in the model, which an older writer omits: optional in the schema too), no others,
and the same types member by member (recursively: objects, arrays, maps, enumerations, null).
Then both accept the real documents and refuse the same mutations."""

from __future__ import annotations

import copy
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import attrs
import pytest
import verifier_helpers as h

from ale.core.documents import DECLARED_STRINGS, DOCUMENT_CLASSES
from ale.core.parse import ParseError, structure
from ale.core.results import TaskResults
from ale.schemas import DOCUMENTS, validate_document

SCHEMAS = Path(__file__).resolve().parents[1] / "ale" / "schemas"
MODELS: dict[str, type] = {**DOCUMENT_CLASSES, "task_results.json": TaskResults}


def _schema(file_name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / f"{DOCUMENTS[file_name]}.schema.json").read_text(encoding="utf-8")))


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        schema = {**root["$defs"][name], **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _alternatives(schema: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    """A schema as a list of single-type schemas (anyOf and type lists spread out)."""
    schema = _resolve(schema, root)
    if "anyOf" in schema:
        return [alt for option in schema["anyOf"] for alt in _alternatives(option, root)]
    if "const" in schema:
        return [{"enum": [schema["const"]]}]
    if "enum" in schema:
        return [{"enum": schema["enum"]}]
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return [{**schema, "type": kind} for kind in kinds]


def _python_alternatives(hint: Any) -> list[Any]:
    if get_origin(hint) in (Union, types.UnionType):
        return [alt for arg in get_args(hint) for alt in _python_alternatives(arg)]
    return [hint]


SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _compare(hint: Any, schema: dict[str, Any], root: dict[str, Any], where: str) -> None:
    pythons = _python_alternatives(hint)
    jsons = _alternatives(schema, root)
    literals = [p for p in pythons if get_origin(p) is Literal]
    enums = [s for s in jsons if "enum" in s]
    if literals or enums:
        values = {v for p in literals for v in get_args(p)} | ({None} if type(None) in pythons else set())
        assert values == {v for s in enums for v in s["enum"]} | {None for s in jsons if s.get("type") == "null"}, where
        pythons = [p for p in pythons if get_origin(p) is not Literal and p is not type(None)]
        jsons = [s for s in jsons if "enum" not in s and s.get("type") != "null"]
        if pythons == [str] and not jsons:  # a str field whose schema is a const (the schema member)
            return
    if int in pythons and float in pythons:  # JSON's number is both (a free-form scalar)
        pythons.remove(int)
    classes = [p for p in pythons if attrs.has(p)]
    if len(classes) > 1:  # a union of classes (the runtime's code): each is the object with its members
        objects = [s for s in jsons if s.get("type") == "object"]
        assert len(objects) == len(classes), where
        for cls in classes:
            fields = {a.name for a in attrs.fields(cls)}
            (match,) = [o for o in objects if set(o["properties"]) == fields]
            _compare_class(cls, match, root, f"{where}<{cls.__name__}>")
        pythons = [p for p in pythons if p not in classes]
        jsons = [s for s in jsons if s not in objects]
    assert len(pythons) == len(jsons), f"{where}: {pythons} vs {[s.get('type') for s in jsons]}"
    by_kind = {s["type"]: s for s in jsons}
    for p in pythons:
        _compare_one(p, by_kind, root, where)


def _compare_one(p: Any, by_kind: dict[str, dict[str, Any]], root: dict[str, Any], where: str) -> None:
    if p in SCALARS:
        assert SCALARS[p] in by_kind, f"{where}: {p} is not {list(by_kind)}"
    elif get_origin(p) is tuple:
        assert "array" in by_kind, where
        _compare(get_args(p)[0], by_kind["array"]["items"], root, f"{where}[]")
    elif get_origin(p) is dict:
        obj = by_kind["object"]
        value = get_args(p)[1]
        if "additionalProperties" in obj and obj["additionalProperties"] is not False:
            _compare(value, obj["additionalProperties"], root, f"{where}{{}}")
        else:  # a map with fixed keys (integrity.json's files)
            assert obj["required"] == sorted(obj["properties"]), where
            for key, sub in obj["properties"].items():
                _compare(value, sub, root, f"{where}.{key}")
        for key, sub in obj.get("properties", {}).items():  # declared members of an open map
            kinds = {s.get("type") for s in _alternatives(sub, root)}
            covered = {SCALARS.get(t) for t in _python_alternatives(value)} | {"number"}
            assert kinds <= covered, f"{where}.{key}: the map's values cannot be {kinds}"
            if where.endswith("declared"):  # narrower than the map: the model's validator says so
                assert tuple(obj["properties"]) == DECLARED_STRINGS
                assert kinds == {"string", "null"}
    elif attrs.has(p):
        _compare_class(p, by_kind["object"], root, where)
    elif p is Any:
        assert "object" in by_kind, where
    else:  # pragma: no cover - a model type this comparison does not know
        raise AssertionError(f"{where}: cannot compare {p}")


def _compare_class(cls: type, schema: dict[str, Any], root: dict[str, Any], where: str) -> None:
    schema = _resolve(schema, root)
    hints = typing.get_type_hints(cls)
    fields = [a.name for a in attrs.fields(cls)]
    assert schema.get("additionalProperties") is False, f"{where}: the schema allows other members"
    assert set(fields) == set(schema["properties"]), f"{where}: {sorted(fields)} vs {sorted(schema['properties'])}"
    optional = {a.name for a in attrs.fields(cls) if a.default is not attrs.NOTHING}
    # every member is required but those added later with a default (absent in older documents)
    assert set(schema["required"]) == set(fields) - optional, f"{where}: every member is required"
    for field in attrs.fields(cls):
        prop = _resolve(schema["properties"][field.name], root)
        if "const" in prop and hints[field.name] is type(prop["const"]):
            # a constant (a document's schema, run.completed): a plain type whose validator pins the value
            assert field.validator is not None, f"{where}.{field.name}: nothing pins the constant"
            continue
        _compare(hints[field.name], prop, root, f"{where}.{field.name}")


@pytest.mark.parametrize("file_name", sorted(MODELS))
def test_model_and_schema_have_the_same_members_and_types(file_name: str) -> None:
    schema = _schema(file_name)
    _compare_class(MODELS[file_name], schema, schema, file_name)


# -- both accept the real documents and refuse the same mutations ---------------------------------


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


def _model_accepts(file_name: str, document: Any) -> bool:
    try:
        structure(document, MODELS[file_name], what=file_name)
    except ParseError:
        return False
    return True


def _schema_accepts(file_name: str, document: Any) -> bool:
    try:
        validate_document(file_name, document)
    except ValueError:
        return False
    return True


def _mutations(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str, Any]]:
    """For every member: drop it, add an unknown sibling, swap its type."""
    out: list[tuple[tuple[Any, ...], str, Any]] = []
    if isinstance(value, dict):
        out.append((path, "add", "surprise_member"))
        for key, child in value.items():
            out.append(((*path, key), "drop", None))
            out.append(((*path, key), "set", [] if not isinstance(child, list) else "a string"))
            out += _mutations(child, (*path, key))
    elif isinstance(value, list) and value:
        out += _mutations(value[0], (*path, 0))
    return out


def _apply(document: Any, path: tuple[Any, ...], op: str, value: Any) -> Any:
    document = copy.deepcopy(document)
    target = document
    for key in path[:-1] if op != "add" else path:
        target = target[key]
    if op == "add":
        target[value] = 1
    elif op == "drop":
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


@pytest.mark.parametrize("file_name", sorted(MODELS))
def test_model_and_schema_accept_the_real_document_and_refuse_its_mutations(world: h.World, file_name: str) -> None:
    """Every member of a real document dropped, doubled by an unknown sibling, or given another
    JSON type: whatever the schema accepts the model accepts too (the schema may refuse more: the
    patterns, ranges and fixed-key maps the model leaves to it), and the model refuses every
    unknown member and every missing one of its classes."""
    refused = 0
    for bundle_name in ("plain", "signed"):
        document = json.loads(world.files(bundle_name)[file_name])
        assert _model_accepts(file_name, document)
        assert _schema_accepts(file_name, document)
        other_type = {**document, "schema": document["schema"].rsplit("/v", 1)[0] + "/v99"}
        assert not _model_accepts(file_name, other_type)
        assert not _schema_accepts(file_name, other_type)
        mutations = _mutations(document)
        for path, op, value in mutations:
            mutated = _apply(document, path, op, value)
            model, schema = _model_accepts(file_name, mutated), _schema_accepts(file_name, mutated)
            assert model or not schema, f"the model refuses what the schema accepts: {path} {op} {value!r}"
            refused += not model
    assert refused > len(mutations) // 2
