"""``ale.core.parse.parse_json``: the one bounded parser for untrusted JSON."""

from __future__ import annotations

import contextlib
import json

import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale.core.parse import JsonLimitError, ParseError, parse_json


def test_deeply_nested_arrays_are_refused_without_recursion_error() -> None:
    # issue 10.1: 200,000 nested arrays gave RecursionError (HTTP 500) from json.loads
    with pytest.raises(JsonLimitError, match="deeper than 64") as info:
        parse_json(b"[" * 200_000 + b"]" * 200_000, what="manifest.json", max_bytes=1 << 20)
    assert info.value.limit == "depth"


def test_depth_limit_is_exact() -> None:
    assert parse_json(b"[" * 64 + b"]" * 64, what="x") == json.loads("[" * 64 + "]" * 64)
    with pytest.raises(JsonLimitError):
        parse_json(b"[" * 65 + b"]" * 65, what="x")
    assert parse_json(b'{"a":' * 10 + b"1" + b"}" * 10, what="x", max_depth=10)
    with pytest.raises(JsonLimitError):
        parse_json(b'{"a":' * 11 + b"1" + b"}" * 11, what="x", max_depth=10)


def test_size_limit() -> None:
    with pytest.raises(JsonLimitError, match="exceeds the limit of 10") as info:
        parse_json(b'"' + b"a" * 20 + b'"', what="body", max_bytes=10)
    assert info.value.limit == "size"


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        (b"9" * 5000, "infinity"),  # more than 4300 digits: ValueError from int() before
        (b"[" + b"9" * 5000 + b"]", "infinity"),
        (b"18446744073709551616", "outside"),
        (b"[18446744073709551616]", "outside"),  # orjson alone reads it as a float
        (b"9007199254740992", "outside"),
        (b'{"a":1,"a":2}', "duplicate object key"),
        (b'"\\ud800"', "surrogate"),
        (b"NaN", "not valid JSON"),
        (b"[Infinity]", "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1,]", "not valid JSON"),
    ],
)
def test_strict_refusals(raw: bytes, fault: str) -> None:
    with pytest.raises(ParseError, match=fault):
        parse_json(raw, what="doc")


def test_messages_name_the_document_and_stay_short() -> None:
    with pytest.raises(ParseError) as info:
        parse_json(b'{"' + b"k" * 100_000 + b'":1,"' + b"k" * 100_000 + b'":2}', what="policy header")
    assert str(info.value).startswith("policy header: ")
    assert len(str(info.value)) < 600


def test_duplicate_keys_allowed_when_asked() -> None:
    assert parse_json(b'{"a":1,"a":2}', what="x", unique_keys=False) == {"a": 2}


def test_str_input_is_measured_in_utf8_bytes() -> None:
    with pytest.raises(JsonLimitError):
        parse_json('"' + "é" * 6 + '"', what="x", max_bytes=13)
    assert parse_json('"' + "é" * 5 + '"', what="x", max_bytes=12) == "é" * 5


@pytest.mark.fuzz
@fuzz_settings
@given(json_values)
def test_fuzz_round_trip_of_valid_values(value: object) -> None:
    raw = json.dumps(value).encode()
    message = ""
    try:
        parsed = parse_json(raw, what="x")
    except ParseError as exc:
        message = str(exc)
    if message:  # only the integers beyond the safe range are refused of what json.dumps writes
        assert "outside" in message
    else:
        assert parsed == json.loads(raw)


@pytest.mark.fuzz
@fuzz_settings
@given(st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode()[:-1])))
def test_fuzz_hostile_input_raises_only_parse_error(raw: bytes) -> None:
    with contextlib.suppress(ParseError):
        parse_json(raw, what="x", max_bytes=1 << 16)
