"""The pure core's parsers: canonical JSON, task definitions, the release manifest."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from importlib import resources

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ale import catalog
from ale.core.canonical import CanonicalError, canonical_json, parse_canonical, reference_canonical_json
from ale.core.parse import ParseError
from ale.core.release import parse_release
from ale.core.tasks import parse_task

# RFC 8785 test vectors (the numbers come from the RFC's appendix B examples).
VECTORS = [
    ({"b": 1, "a": [1.0, "é", None, True]}, b'{"a":[1,"\xc3\xa9",null,true],"b":1}'),
    ({"numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001]},
     b'{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}'),
    ({"\u20ac": 1, "\r": 2, "1": 3, "\U0001f600": 4, "\u00f6": 5},
     '{"\\r":2,"1":3,"\u00f6":5,"\u20ac":1,"\U0001f600":4}'.encode()),
    ([], b"[]"),
    ("\u0000\u001f\"\\/", b'"\\u0000\\u001f\\"\\\\/"'),
]  # fmt: skip


@pytest.mark.parametrize(("value", "expected"), VECTORS)
def test_canonical_json_vectors(value: object, expected: bytes) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1: 2}, {"a": object()}, 2**60, b"bytes"])
def test_canonical_json_refuses_values_without_a_canonical_form(bad: object) -> None:
    with pytest.raises(CanonicalError):
        canonical_json(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(json_values)
def test_canonical_json_is_idempotent_and_parses_back(value: object) -> None:
    raw = canonical_json(value)
    # JCS numbers are IEEE doubles: an integral float beyond 2**53 comes back as a float.
    reparsed = json.loads(raw, parse_int=lambda s: int(s) if abs(int(s)) < 2**53 else float(s))
    assert canonical_json(reparsed) == raw


def _task(**overrides: object) -> bytes:
    raw = json.loads((resources.files("ale") / "tasks/cartpole-balance/task.json").read_bytes())
    raw.update(overrides)
    return json.dumps(raw).encode()


def test_installed_tasks_parse_and_cover_both_genres_and_modes() -> None:
    tasks = catalog.tasks()
    assert len(tasks) >= 4
    assert {t.spec.genre for t in tasks.values()} == {"reproduction", "open"}
    assert {t.spec.mode for t in tasks.values()} == {"interactive", "batch"}
    for task in tasks.values():
        assert len(task.paper) > 200, f"{task.spec.id}: the method write-up is missing"
        assert task.spec.safety_metrics


def test_task_digest_covers_the_paper() -> None:
    raw = _task()
    _, d1 = parse_task(raw, paper=b"method A")
    _, d2 = parse_task(raw, paper=b"method B")
    _, d3 = parse_task(_task(version="1.0.1"), paper=b"method A")
    assert len({d1, d2, d3}) == 3


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"extra": 1}, "extra fields"),
        ({"genre": "closed"}, "genre"),
        ({"mode": "batchy"}, "mode"),
        ({"version": "1.0"}, "version"),
        ({"id": "../etc"}, "task id"),
        ({"official_episodes": 0}, "official_episodes"),
        ({"official_episodes": True}, "official_episodes"),
        ({"safety_metrics": []}, "safety metric"),
        ({"safety_metrics": ["falls", "falls"]}, "repeat"),
        ({"gym_kwargs": {"a": [1]}}, "gym_kwargs"),
        ({"headline": {"metric": "x", "direction": "sideways"}}, "headline"),
        ({"budgets": {"wall_time_s": -1, "env_steps": 1, "llm_tokens": 1}}, "budgets"),
    ],
)
def test_bad_task_definitions_are_refused_with_the_field_named(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_task(_task(**overrides), paper=b"")
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"schema": "ale-task/v1"}', b"1" * 2_000_000]
)
def test_garbage_task_definitions_are_refused(raw: bytes) -> None:
    with pytest.raises(ParseError):
        parse_task(raw, paper=b"")


def test_release_manifest_hashes() -> None:
    raw = catalog.release_bytes()
    manifest, digest = parse_release(raw, catalog.lock_bytes)
    assert digest == hashlib.sha256(raw).hexdigest()
    refs = sorted(manifest.required_tasks)
    assert manifest.required_task_set_hash == hashlib.sha256(canonical_json(refs)).hexdigest()
    installed = {t.spec.ref for t in catalog.tasks().values()}
    assert set(manifest.required_tasks) <= installed
    assert manifest.cap == 1.5
    assert manifest.eps == 1e-9


def _release(**overrides: object) -> bytes:
    data = json.loads(catalog.release_bytes())
    data.update(overrides)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"cap": 0}, "cap"),
        ({"cap": "1.5"}, "cap"),
        ({"schema": "ale-release-manifest/v0"}, "schema"),
        ({"required_tasks": ["nope@1.0.0"]}, "without a target"),
        ({"required_tasks": ["a@1", "a@1"]}, "repeat"),
        ({"aggregate": "median"}, "aggregate"),
        ({"tasks": {"x@1.0.0": {"paper_value": -1.0, "safety_limits": {}}}}, "paper_value"),
        ({"tasks": {"x@1.0.0": {"paper_value": 1.0, "safety_limits": {"falls": 0}}}}, "safety limit"),
        ({"surprise": True}, "extra fields"),
    ],
)
def test_bad_release_manifests_are_refused(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ParseError) as err:
        parse_release(_release(**overrides), catalog.lock_bytes)
    assert needle in str(err.value)


any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1.0, -0.0, 1e-4, 9.999e15, 1e16, 1e21, 1e-7, 5e-324, 0.1, 123.456])
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(any_json)
def test_fast_path_agrees_with_the_reference_rfc8785_library(value: object) -> None:
    try:
        expected = reference_canonical_json(value)
    except CanonicalError:
        with pytest.raises(CanonicalError):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


@pytest.mark.parametrize("key", ["\U0001f600", "\ue000", "a\U0001f600", "\uffff"])
def test_key_order_follows_utf16_code_units(key: str) -> None:
    value = {key: 1, "\ue001": 2, "\U00010000": 3}
    assert canonical_json(value) == reference_canonical_json(value)


# -- parse_canonical: the fast "are these bytes canonical?" check ----------------------------------


def _reference_accepts(raw: bytes) -> tuple[bool, object]:
    """The reference decision: strict parse, RFC 8785 re-encode, byte comparison."""
    try:
        value = json.loads(raw)
        return reference_canonical_json(value) == raw, value
    except (ValueError, RecursionError):
        return False, None


def _same(a: object, b: object) -> bool:
    """Equal with types (1 and 1.0 differ, -0.0 and 0.0 differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and a == b  # type: ignore[arg-type]
    return a == b


def _check_parse_canonical(raw: bytes) -> None:
    accepted, value = _reference_accepts(raw)
    fast = parse_canonical(raw)
    if fast is not None or raw == b"null":
        assert accepted, raw  # never vouches for what the reference refuses
        assert _same(fast, value), raw  # and gives the very same value


@settings(max_examples=800, deadline=None)
@given(any_json)
def test_parse_canonical_vouches_only_for_canonical_bytes(value: object) -> None:
    try:
        raw = reference_canonical_json(value)
    except CanonicalError:
        return
    _check_parse_canonical(raw)
    # Non-canonical spellings of the same document: whitespace, Python's own encoder, escapes.
    for variant in (
        json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"),
        json.dumps(value, sort_keys=True, separators=(",", ":")).encode(),
        json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"),
    ):
        _check_parse_canonical(variant)


@settings(max_examples=800, deadline=None)
@given(any_json, st.data())
def test_parse_canonical_never_vouches_for_a_mutated_line(value: object, data: st.DataObject) -> None:
    try:
        raw = reference_canonical_json(value)
    except CanonicalError:
        return
    pos = data.draw(st.integers(0, len(raw)))
    insert = data.draw(st.sampled_from([b" ", b"0", b".0", b"\\u0041", b",", b"e+16", b'"', b"-", b"\xf0\x9f\x98\x80"]))
    _check_parse_canonical(raw[:pos] + insert + raw[pos:])
    if raw:
        _check_parse_canonical(raw[:pos] + raw[pos + 1 :])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1.0}', b'{"a":[0.5,2.0]}', b'{"a":-0.0}', b'{"a":1e+16}', b'{"a":9007199254740992}', b"1.0",
        b'{"b":1,"a":2}', b'{"a":1,"a":1}', b'{"a":"\\u0041"}', b'{"a":"\\/"}', b'{"a":1E-7}', b'{"a":1e-07}',
        b'{ "a":1}', b'{"a":1}\n', b'{"a":"\\ud800"}', b'{"a":NaN}', b'{"a":1e999}',
        b'{"\xee\x80\x80":2,"\xf0\x9f\x98\x80":1}',
        b'{"a":"\\u001F"}', b'{"a":"\\u007f"}', b"\xef\xbb\xbf{}", b'{"a":18446744073709551616}',
        b'{"a":9.35742879010263e-6}', b'{"a":[1e-6]}',
    ],
)  # fmt: skip
def test_parse_canonical_refuses_non_canonical_spellings(raw: bytes) -> None:
    assert not _reference_accepts(raw)[0]
    assert parse_canonical(raw) is None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1}',
        b'{"a":1e-7}',
        b'{"a":0.00001}',
        b'{"a":1e+21}',
        b'{"a":"\\u001f\\n"}',
        b'{"\xc3\xa9":"\xe2\x82\xac"}',
        b'{"\xf0\x9f\x98\x80":1,"\xee\x80\x80":2}',
    ],
)
def test_parse_canonical_agrees_on_canonical_lines(raw: bytes) -> None:
    assert _reference_accepts(raw)[0]
    _check_parse_canonical(raw)


def test_orjson_writes_every_code_point_as_rfc8785_does() -> None:
    """The string half of the fast path's premise, checked exhaustively (the reference is slow,
    so it is checked against the rule it implements: JSON's mandatory escapes, lowercase hex)."""
    short = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}
    for cp in [*range(0xD800), *range(0xE000, 0x110000)]:
        expected = short.get(cp) or (f"\\u{cp:04x}" if cp < 0x20 else chr(cp))
        assert orjson.dumps(chr(cp)) == ('"' + expected + '"').encode(), hex(cp)
    for cp in [*range(0x80), 0xE9, 0x2028, 0xFFFF, 0x1F600]:
        assert reference_canonical_json(chr(cp)) == orjson.dumps(chr(cp))


def test_orjson_writes_non_integral_floats_as_rfc8785_does_outside_its_exponent_band() -> None:
    """The float half of the premise, on random bit patterns and on every decade; inside the band
    the fast path leaves alone, orjson does differ (so the band is needed)."""
    rng = random.Random(8785)
    samples = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(20000)]
    samples += [rng.uniform(1, 10) * 10.0**e for e in range(-320, 300) for _ in range(5)]
    samples += [float(f"{f:.2g}") for f in samples[-3000:]]
    checked = differ_in_band = 0
    for f in samples:
        if not math.isfinite(f) or f.is_integer():
            continue
        assert orjson.loads(reference_canonical_json(f)) == f
        if 1e-7 <= abs(f) < 1e-5:
            differ_in_band += orjson.dumps(f) != reference_canonical_json(f)
            continue
        assert orjson.dumps(f) == reference_canonical_json(f), repr(f)
        checked += 1
    assert checked > 10000
    assert differ_in_band > 0
    assert parse_canonical(b'{"a":0.000001}') is None
    assert parse_canonical(b'{"a":1e-6}') is None


@settings(max_examples=500, deadline=None)
@given(
    data=st.dictionaries(st.text(max_size=6), any_json, max_size=5),
    monotonic=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e20, max_value=1e20)
    | st.sampled_from([0.0, 1.0, 1e-5, 5e-7, 12345.678]),
    wall=st.floats(min_value=0, max_value=253_402_300_799),
)
def test_a_chain_line_assembled_member_by_member_is_the_reference_canonical_json_of_its_event(
    data: dict[str, object], monotonic: float, wall: float
) -> None:
    """ChainBuilder's fast assembly (data encoded once, the envelope joined by hand) writes exactly
    what RFC 8785 writes for the event, hash included, or takes the reference path."""
    from ale.core.trajectory import ChainBuilder, event_hash

    try:
        event, line = ChainBuilder().build("untrusted_agent", "stdout", data, wall_time=wall, monotonic=monotonic)
    except ValueError:
        return  # no form a verifier reads back: refused, not written
    without = {**{k: v for k, v in event.items() if k != "hash"}, "data": data}  # as given, not as prepared
    assert event["hash"] == event_hash(without)
    assert line == reference_canonical_json({**without, "hash": event["hash"]}) + b"\n"
