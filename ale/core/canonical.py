"""Canonical JSON: the one byte form every hash in ALE Robotics is taken over.

It is RFC 8785, the JSON Canonicalization Scheme (JCS), through the
``rfc8785`` library (the one sigstore-python uses): UTF-8, no whitespace,
object keys sorted by UTF-16 code units, numbers in ECMAScript's shortest
form (``1.0`` is written ``1``), and integers limited to the IEEE-754 safe
range. NaN, infinities, non-string keys and out-of-range integers are refused.
docs/formats.md gives test vectors.
"""

from __future__ import annotations

from typing import Any

import rfc8785


class CanonicalError(ValueError):
    """A value that has no canonical JSON form (NaN, a non-string key, ...)."""


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` per RFC 8785."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CanonicalError(f"no canonical JSON form: {exc}") from None
