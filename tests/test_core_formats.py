"""The pure core's parsers: canonical JSON, task definitions, the release manifest."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ale import catalog
from ale.core.canonical import CanonicalError, canonical_json, reference_canonical_json
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
    manifest, digest = parse_release(raw)
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
        parse_release(_release(**overrides))
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
