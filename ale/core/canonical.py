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
import re
from typing import Any

import orjson
import rfc8785

_SAFE_INT = 2**53 - 1
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


class CanonicalError(ValueError):
    """A value that has no canonical JSON form (NaN, a non-string key, ...)."""


class _Slow(Exception):
    """The fast path cannot vouch for this value; use the reference implementation."""


def _fast(value: Any, depth: int = 0) -> Any:  # noqa: C901 - one branch per JSON type on the hashing hot path
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


# -- checking that bytes are canonical ------------------------------------------------------------
#
# Verifying a trajectory means checking that every line is the canonical form of its own content:
# parse, re-encode, compare. ``orjson`` does both in C and agrees with RFC 8785 byte for byte on
# strings (every code point is tested) and on non-integral floats (tested on random doubles); it
# refuses integers outside the safe range itself (OPT_STRICT_INTEGER). It differs on integral
# floats, which it writes as ``1.0`` or ``1e+16`` where ECMAScript writes ``1`` and
# ``10000000000000000``, and on magnitudes in [1e-6, 1e-5), which it writes with an exponent
# (``1e-6``) where ECMAScript writes ``0.000001``; a value holding such a float (the band is taken
# a decade wider) is left to the reference path. Object keys are sorted by code point, which is
# UTF-16 order unless a key holds a character outside the Basic Multilingual Plane, so lines with
# such a character take the reference path.

NON_BMP = re.compile(rb"[\xf0-\xf4]")  # the lead bytes of UTF-8 sequences beyond the BMP
ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
#: magnitudes where orjson may write an exponent and RFC 8785 does not (a decade wider than seen)
ORJSON_EXPONENT_BAND = _BAND_LOW, _BAND_HIGH = 1e-7, 1e-5


def floats_agree(values: list[Any] | tuple[Any, ...]) -> bool:
    """True if orjson writes every float in ``values`` as RFC 8785 does (see above)."""
    stack: list[Any] = [values]
    while stack:
        item = stack.pop()
        for child in item.values() if type(item) is dict else item:  # a list or the tuple given
            kind = type(child)
            if kind is str or kind is int:
                continue
            if kind is dict or kind is list:
                stack.append(child)
            elif kind is float and (child.is_integer() or _BAND_LOW <= abs(child) < _BAND_HIGH):
                return False
    return True


def parse_canonical(raw: bytes) -> Any | None:
    """``raw`` parsed, if it is provably the canonical JSON of what it holds; else None.

    None means "not proven", not "not canonical": the caller decides with the reference path
    (:func:`canonical_json` of the strictly parsed value compared with the bytes), which also
    names the fault. A value is only returned for bytes that path would accept, and it is the same
    value. (``ale.core.trajectory.check_chunk`` writes these steps out in its hot loop.)
    """
    if not raw.isascii() and NON_BMP.search(raw):
        return None
    try:
        value = orjson.loads(raw)
        again = orjson.dumps(value, option=ORJSON_OPTIONS)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    if again != raw or not floats_agree([value]):
        return None
    return value
