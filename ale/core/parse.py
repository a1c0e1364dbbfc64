"""Parse, don't validate: untrusted JSON into frozen attrs classes.

One cattrs converter that forbids extra keys and reports every problem with
its path, so an error names the field that is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_structure_fn
from cattrs.v import format_exception

T = TypeVar("T")


class ParseError(ValueError):
    """Input that is not what its schema says; the message names the field."""


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)

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

    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)

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


def loads(raw: bytes | str, cls: type[T], *, what: str, max_bytes: int = 1 << 20) -> T:
    """Decode JSON text (bounded in size) and structure it into ``cls``."""
    if len(raw) > max_bytes:
        raise ParseError(f"{what}: {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ParseError(f"{what}: not valid JSON ({exc})") from None
    return structure(data, cls, what=what)
