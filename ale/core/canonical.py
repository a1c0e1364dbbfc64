"""Canonical JSON: the one byte form every hash in ALE Robotics is taken over.

It is RFC 8785, the JSON Canonicalization Scheme (JCS): UTF-8, no whitespace, object keys
sorted by UTF-16 code units, numbers in ECMAScript's shortest form (``1.0`` is written ``1``),
integers limited to the IEEE-754 safe range. NaN, infinities, non-string keys and
out-of-range integers are refused. docs/formats.md gives test vectors.

The reference is the ``rfc8785`` library (the one sigstore-python uses). Because it is pure
Python and the trajectory hashes every event, a fast path serialises the common case with the
standard library's C encoder, where the two agree byte for byte: no key outside the Basic
Multilingual Plane (where code point and UTF-16 order could differ), integers within
+/-(2**53 - 1), and floats that are integral (written as integers) or have a magnitude in
[1e-4, 1e16) with a non-zero fraction (where Python's shortest ``repr`` and ECMAScript's
``Number.prototype.toString`` coincide). Anything else takes the reference path; a property
test checks the two paths agree.
"""

from __future__ import annotations

import json
import math
from typing import Any

import rfc8785

_SAFE_INT = 2**53 - 1
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


class CanonicalError(ValueError):
    """A value that has no canonical JSON form (NaN, a non-string key, ...)."""


class _Slow(Exception):
    """The fast path cannot vouch for this value; use the reference implementation."""


def _fast(value: Any, depth: int = 0) -> Any:
    if depth > 100:
        raise _Slow
    if value is None or value is True or value is False or type(value) is str:
        return value
    if type(value) is int:
        if -_SAFE_INT <= value <= _SAFE_INT:
            return value
        raise _Slow
    if type(value) is float:
        if not math.isfinite(value):
            raise _Slow
        if value.is_integer():
            if abs(value) <= _SAFE_INT:
                return int(value)
            raise _Slow
        if 1e-4 <= abs(value) < 1e16:
            return value
        raise _Slow
    if type(value) is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or (not key.isascii() and key and max(key) > "\uffff"):
                raise _Slow
            out[key] = _fast(item, depth + 1)
        return out
    if type(value) in (list, tuple):
        return [_fast(item, depth + 1) for item in value]
    raise _Slow


def reference_canonical_json(value: Any) -> bytes:
    """RFC 8785 through the reference library only."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CanonicalError(f"no canonical JSON form: {exc}") from None


def prepare(value: Any) -> Any | None:
    """A copy of ``value`` the fast encoder serialises canonically, or None (use the reference)."""
    try:
        return _fast(value)
    except _Slow:
        return None


def encode_prepared(prepared: Any) -> bytes:
    """Encode what :func:`prepare` returned (raises UnicodeEncodeError on a lone surrogate)."""
    return _ENCODER.encode(prepared).encode("utf-8")


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` per RFC 8785."""
    prepared = prepare(value)
    if prepared is None:
        return reference_canonical_json(value)
    try:
        return encode_prepared(prepared)
    except UnicodeEncodeError:  # a lone surrogate: let the reference decide
        return reference_canonical_json(value)
