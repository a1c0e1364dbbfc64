"""The fuzz targets' shared settings: every parser of untrusted input has a Hypothesis target
marked ``fuzz`` that feeds it random, mutated and hostile bytes. ``ALE_FUZZ_EXAMPLES`` sets how
many inputs each target gets (CI runs the default: a bounded time, a few seconds a target);
raise it for a long local campaign, e.g. ``ALE_FUZZ_EXAMPLES=100000 pytest -m fuzz``."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ_EXAMPLES = int(os.environ.get("ALE_FUZZ_EXAMPLES", "300"))

#: Use as ``@fuzz_settings`` under ``@given``: bounded by example count, never by a timer.
fuzz_settings = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    derandomize=os.environ.get("CI") == "true",
)

#: JSON-ish text: valid JSON values, their mutations, and hostile shapes (deep nesting, huge
#: numbers, duplicate keys, lone surrogates, bytes that are not UTF-8).
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)
hostile_json = st.one_of(
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(1, 6000).map(lambda n: b"9" * n),
    st.integers(1, 200).map(lambda n: b"[" * n),
    st.sampled_from(
        [b'{"a":1,"a":2}', b'"\\ud800"', b"NaN", b"[Infinity]", b"1e400", b"\xff\xfe", b"", b"   ", b"[1,]", b"{,}"]
    ),
    st.binary(max_size=200),
)


def json_paths(value: Any, *, per_list: int | None = None, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (dict keys, list indexes: the first
    ``per_list`` of each list, or all), the root ``()`` included: where a fuzz target edits it."""
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += json_paths(child, per_list=per_list, prefix=(*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value[:per_list]):
            out += json_paths(child, per_list=per_list, prefix=(*prefix, i))
    return out


def replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of a JSON document with the value at ``path`` (of :func:`json_paths`) replaced."""
    if not path:
        return value
    document = json.loads(json.dumps(document))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return document
