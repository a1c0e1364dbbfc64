"""Parse, don't validate: untrusted JSON into frozen attrs classes.

:func:`parse_json` is the one JSON parser for untrusted bytes in the project (bundle documents,
trajectory lines, policy headers, the agent's event channel, API bodies): bounded in size and
nesting depth, strict (RFC 8259 grammar, UTF-8, unique object keys, no NaN or infinities,
integers within the IEEE-754 safe range as I-JSON, RFC 7493, asks), and it never raises anything
but :class:`ParseError`. One cattrs converter that forbids extra keys then structures the value
and reports every problem with its path, so an error names the field that is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
import orjson
from cattrs.cols import homogenous_tuple_structure_factory, mapping_structure_factory
from cattrs.gen import make_dict_structure_fn
from cattrs.v import format_exception

T = TypeVar("T")
#: A JSON scalar, for free-form members whose values are never containers.
Scalar = str | int | float | bool | None


class ParseError(ValueError):
    """Input that is not what its schema says; the message names the field."""


class JsonLimitError(ParseError):
    """JSON past a size or nesting limit (``limit`` is ``"size"`` or ``"depth"``)."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


#: Defaults of :func:`parse_json`; callers with a documented limit of their own pass it.
MAX_JSON_BYTES = 1 << 20
MAX_JSON_DEPTH = 64
SAFE_INTEGER = 2**53 - 1
_ORJSON_DEPTH = 1024  # orjson refuses deeper input itself, in C, before any Python recursion
_MAX_REPORTED = 200


def non_negative(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    """An attrs validator shared by the document models: an integer that is not below 0."""
    if value < 0:
        raise ValueError(f"{attr.name} must not be negative")


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_REPORTED else text[:_MAX_REPORTED] + f"... ({len(text) - _MAX_REPORTED} more)"


def _walk(value: Any, max_depth: int) -> bool:
    """Check nesting depth and integers without recursion; True if a float needs a second look
    (orjson reads an integer literal beyond 64 bits as a float, which a strict parser refuses)."""
    suspicious = False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item
        if depth > max_depth:
            raise JsonLimitError(f"nested deeper than {max_depth} levels", "depth")
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is int:
                if not -SAFE_INTEGER <= child <= SAFE_INTEGER:
                    raise ParseError(f"integer {_clip(str(child))} is outside +/-(2**53 - 1)")
            elif kind is float and abs(child) >= 9.2e18:
                suspicious = True
    return suspicious


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 16 or not -SAFE_INTEGER <= int(text) <= SAFE_INTEGER:
        raise ValueError(f"integer {_clip(text)} is outside +/-(2**53 - 1)")
    return int(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate object key {_clip(repr(key))}")
            seen.add(key)
    return out


def parse_json(
    raw: bytes | str,
    *,
    what: str,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    unique_keys: bool = True,
) -> Any:
    """Parse untrusted JSON text into Python values, or raise :class:`ParseError` naming ``what``.

    Refused: more than ``max_bytes`` bytes, or nesting deeper than ``max_depth`` arrays and
    objects (:class:`JsonLimitError`); text that is not UTF-8 or not JSON; NaN and infinities;
    integers outside +/-(2**53 - 1); a repeated object key (with ``unique_keys``; a caller that
    then compares the bytes with their canonical form may skip this, since such text is never
    canonical). The depth is checked before any recursive parse, so no input can exhaust the
    stack, and a number's digits are counted before it is converted.
    """
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise JsonLimitError(f"{what}: {size} bytes exceeds the limit of {max_bytes}", "size")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise JsonLimitError(f"{what}: nested deeper than {max_depth} levels", "depth") from None
        raise ParseError(f"{what}: not valid JSON ({_clip(str(exc))})") from None
    try:  # wrapped in a list, so that a lone scalar is checked like any member
        suspicious = _walk([value], max_depth + 1)
    except JsonLimitError as exc:
        raise JsonLimitError(f"{what}: nested deeper than {max_depth} levels", exc.limit) from None
    except ParseError as exc:
        raise ParseError(f"{what}: {exc}") from None
    if suspicious or unique_keys:
        # Depth is known to be small now, so the standard library's recursive parser is safe.
        try:
            value = json.loads(
                raw,
                parse_int=_bounded_int,
                parse_constant=_no_constant,
                object_pairs_hook=_unique if unique_keys else None,
            )
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"{what}: not valid JSON ({_clip(str(exc))})") from None
    return value


def _strict_float(value: Any, _t: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _strict_int(value: Any, _t: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    return value


def _strict_str(value: Any, _t: type) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _strict_bool(value: Any, _t: type) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {type(value).__name__}")
    return value


def _strict_none(value: Any, _t: type) -> None:
    if value is not None:
        raise ValueError(f"expected null, got {type(value).__name__}")


def _strict_scalar(value: Any, _t: type) -> Any:
    if value is not None and type(value) not in (str, int, float, bool):
        raise ValueError(f"expected a string, number, boolean or null, got {type(value).__name__}")
    return value


def _only(kind: type, name: str, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    # cattrs would make a tuple of a string's characters or a dict's keys; JSON arrays only
    def structure_container(value: Any, t: Any) -> Any:
        if type(value) is not kind:
            raise ValueError(f"expected {name}, got {type(value).__name__}")
        return inner(value, t)

    return structure_container


def _is_tuple(t: Any) -> bool:
    args = get_args(t)
    return get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_mapping(t: Any) -> bool:
    origin: Any = get_origin(t)
    return origin is dict or origin is Mapping


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook_func(lambda t: t is None or t is type(None), _strict_none)
    conv.register_structure_hook(Scalar, _strict_scalar)

    conv.register_structure_hook_factory(
        _is_tuple, lambda t: _only(list, "an array", homogenous_tuple_structure_factory(t, conv))
    )

    conv.register_structure_hook_factory(
        _is_mapping, lambda t: _only(dict, "an object", mapping_structure_factory(t, conv))
    )

    def _attrs_factory(cls: type) -> Any:
        inner: Callable[[Any, type], Any] = make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True)

        def structure_object(value: Any, t: type) -> Any:
            if not isinstance(value, dict):
                raise ValueError(f"expected an object for {cls.__name__}, got {type(value).__name__}")
            return inner(value, t)

        return structure_object

    conv.register_structure_hook_factory(lambda t: hasattr(t, "__attrs_attrs__"), _attrs_factory)
    return conv


converter = _make_converter()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, format_exception=_format_leaf))
    return str(exc)


def _format_leaf(exc: BaseException, type_: type | None) -> str:
    """cattrs' wording, plus the validator's own message where there is one."""
    base = format_exception(exc, type_)
    if isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, cattrs.BaseValidationError) and exc.args:
        # attrs validators put the readable message first and the Attribute object after it.
        first = exc.args[0]
        return f"{base}: {first}" if isinstance(first, str) else base
    return base


def structure(data: Any, cls: type[T], *, what: str) -> T:
    """Structure already-decoded JSON ``data`` into ``cls`` or raise ParseError."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise ParseError(f"{what}: {_describe(exc)}") from None


def loads(raw: bytes | str, cls: type[T], *, what: str, max_bytes: int = MAX_JSON_BYTES) -> T:
    """Parse JSON text with :func:`parse_json` and structure it into ``cls``."""
    return structure(parse_json(raw, what=what, max_bytes=max_bytes), cls, what=what)
