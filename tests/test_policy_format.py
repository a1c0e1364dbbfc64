"""ale-policy/v1 artifacts: round trips, the forward pass, and hostile files."""

from __future__ import annotations

import contextlib
import itertools
import json
import pickle
import struct

import numpy as np
import pytest
import safetensors.numpy
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given, settings
from hypothesis import strategies as st

from ale.policy import (
    MAX_POLICY_BYTES,
    PolicyError,
    PolicyOutputError,
    linear_policy,
    load_policy,
    save_policy,
)


def _artifact(tensors: dict[str, np.ndarray], arch: dict[str, object]) -> bytes:
    return safetensors.numpy.save(tensors, metadata={"ale-policy": json.dumps(arch)})


def _arch(**overrides: object) -> dict[str, object]:
    arch: dict[str, object] = {
        "format": "ale-policy/v1",
        "observation_dim": 3,
        "normalizer": None,
        "layers": [{"weight": "w", "bias": "b", "activation": "identity"}],
        "output": {"kind": "box", "squash": "clip"},
    }
    arch.update(overrides)
    return arch


GOOD = {"w": np.ones((2, 3)), "b": np.zeros(2)}


def test_linear_policy_computes_w_x_plus_b_and_clips() -> None:
    raw = linear_policy(np.array([[1.0, -2.0, 0.5]]), np.array([0.25]))
    policy = load_policy(raw)
    obs = np.array([[1.0, 1.0, 2.0], [10.0, 0.0, 0.0]])
    out = policy.act(obs, np.array([-3.0]), np.array([3.0]))
    assert out.tolist() == [[0.25], [3.0]]


def test_mlp_with_normaliser_matches_a_hand_computation() -> None:
    rng = np.random.default_rng(0)
    w0, b0, w1, b1 = rng.normal(size=(5, 3)), rng.normal(size=5), rng.normal(size=(2, 5)), rng.normal(size=2)
    mean, std = rng.normal(size=3), rng.uniform(0.5, 2, size=3)
    raw = save_policy([(w0, b0, "relu"), (w1, b1, "identity")], output="tanh", normalizer=(mean, std, 2.0))
    obs = rng.normal(size=(4, 3)) * 5
    x = np.clip((obs - mean) / std, -2, 2)
    y = np.maximum(x @ w0.T + b0, 0) @ w1.T + b1
    low, high = np.array([-1.0, 0.0]), np.array([1.0, 4.0])
    expected = low + (np.tanh(y) + 1) / 2 * (high - low)
    np.testing.assert_allclose(load_policy(raw).act(obs, low, high), expected)


def test_discrete_output_is_argmax_plus_start() -> None:
    raw = linear_policy(np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), output="discrete")
    acts = load_policy(raw).act(np.array([[1.0, 0, 0], [-1.0, 0, 0], [0.0, 0, 0]]), start=5)
    assert acts.tolist() == [6, 5, 5]  # ties go to the first


@settings(max_examples=40, deadline=None)
@given(
    widths=st.lists(st.integers(1, 16), min_size=2, max_size=4),
    activation=st.sampled_from(["identity", "tanh", "relu"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_save_load_round_trip_preserves_the_function(widths: list[int], activation: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(size=(o, i)), rng.normal(size=o), activation) for i, o in itertools.pairwise(widths)]
    raw = save_policy(layers, output="clip")
    obs = rng.normal(size=(3, widths[0]))
    x = obs
    for w, b, _ in layers:
        x = x @ w.T + b
        x = np.tanh(x) if activation == "tanh" else np.maximum(x, 0) if activation == "relu" else x
    big = np.full(widths[-1], 1e9)
    np.testing.assert_allclose(load_policy(raw).act(obs, -big, big), x)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "too short"),
        (b"\x00" * 7, "too short"),
        (struct.pack("<Q", 2**40) + b"{}", "header length"),
        (struct.pack("<Q", 2) + b"{]", "not valid JSON"),
        (pickle.dumps({"w": [1, 2, 3]}), "header length"),
        (_artifact(GOOD, _arch())[:-5], "safetensors"),
        (safetensors.numpy.save(GOOD), "ale-policy"),
        (_artifact(GOOD, _arch(format="ale-policy/v2")), "format"),
        (_artifact(GOOD, _arch(observation_dim=4)), "inputs"),
        (_artifact(GOOD, _arch(layers=[])), "layers"),
        (_artifact(GOOD, _arch(layers=[{"weight": "w", "bias": "b", "activation": "sigmoid"}])), "activation"),
        (_artifact(GOOD, _arch(layers=[{"weight": "nope", "bias": "b", "activation": "tanh"}])), "missing"),
        (_artifact({**GOOD, "spare": np.zeros(1)}, _arch()), "not used"),
        (_artifact({"w": np.full((2, 3), np.nan), "b": np.zeros(2)}, _arch()), "NaN"),
        (_artifact({"w": np.ones((2, 3), dtype=np.int32), "b": np.zeros(2)}, _arch()), "float32"),
        (_artifact({"w": np.ones(3), "b": np.zeros(2)}, _arch()), "dimensions"),
        (_artifact({"w": np.ones((2, 3)), "b": np.zeros(3)}, _arch()), "do not fit"),
        (_artifact(GOOD, _arch(output={"kind": "box"})), "squash"),
        (_artifact(GOOD, _arch(output={"kind": "discrete", "squash": "clip"})), "no squash"),
        (_artifact(GOOD, _arch(output={"kind": "continuous"})), "kind"),
        (_artifact(GOOD, _arch(extra=1)), "extra fields"),
        (_artifact(GOOD, _arch(normalizer={"mean": "w", "std": "b", "clip": 1.0})), "dimensions"),
        (_artifact(GOOD, _arch(layers=[{"weight": "w", "bias": "b", "activation": "identity"}] * 9)), "layers"),
    ],
)
def test_hostile_artifacts_are_refused_with_a_reason(raw: bytes, needle: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy(raw)
    assert needle in str(err.value)


def test_oversized_artifact_is_refused_before_parsing() -> None:
    with pytest.raises(PolicyError, match="limit"):
        load_policy(b"\x00" * (MAX_POLICY_BYTES + 1))


def test_too_many_parameters_are_refused() -> None:
    tensors = {"w0": np.zeros((1024, 3)), "b0": np.zeros(1024)}
    layers = [{"weight": "w0", "bias": "b0", "activation": "relu"}]
    for i in range(1, 3):
        tensors[f"w{i}"], tensors[f"b{i}"] = np.zeros((1024, 1024)), np.zeros(1024)
        layers.append({"weight": f"w{i}", "bias": f"b{i}", "activation": "relu"})
    with pytest.raises(PolicyError, match="parameters"):
        load_policy(_artifact(tensors, _arch(layers=layers)), max_bytes=64 * 1024 * 1024)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_crash_the_loader(raw: bytes) -> None:
    with pytest.raises(PolicyError):
        load_policy(raw)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 400), st.integers(0, 255))
def test_a_flipped_byte_is_refused_or_still_a_valid_policy(position: int, value: int) -> None:
    raw = bytearray(linear_policy(np.ones((2, 3))))
    raw[position % len(raw)] = value
    try:
        policy = load_policy(bytes(raw))
    except PolicyError:
        return
    assert np.all(np.isfinite(policy.forward(np.ones((1, policy.architecture.observation_dim)))))


# -- the header and the architecture are untrusted JSON ------------------------------------------------


def _with_header(header: bytes, data: bytes = b"") -> bytes:
    """A safetensors file whose JSON header is exactly ``header``."""
    return struct.pack("<Q", len(header)) + header + data


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _meta(value: str) -> bytes:
    return json.dumps({"__metadata__": {"ale-policy": value}}).encode()


HUGE_INTEGER = "9" * 5000  # past Python's 4300-digit int(str) limit


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        pytest.param(
            _with_header(_nested(200_000)), "safetensors header: nested deeper", id="header-200k-nested-arrays"
        ),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": "x"}, "w": ' + _nested(5000) + b"}"),
            "safetensors header: nested deeper",
            id="header-nested-inside-a-tensor",
        ),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": 7}}'), "is a JSON number", id="ale-policy-a-number"
        ),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": {"format": "ale-policy/v1"}}}'),
            "is a JSON object; it must be a string",
            id="ale-policy-an-object",
        ),
        pytest.param(_with_header(b'{"__metadata__": {"ale-policy": null}}'), "is a JSON null", id="ale-policy-null"),
        pytest.param(_with_header(b'{"__metadata__": {"ale-policy": ["a"]}}'), "is a JSON array", id="ale-policy-list"),
        pytest.param(_with_header(b'{"__metadata__": ["ale-policy"]}'), "'ale-policy' entry", id="metadata-a-list"),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": "{}"}, "n": ' + HUGE_INTEGER.encode() + b"}"),
            "safetensors header: not valid JSON (number is infinity",
            id="header-integer-of-5000-digits",
        ),
        pytest.param(
            _with_header(_meta('{"observation_dim": ' + HUGE_INTEGER + "}")),
            "policy architecture: not valid JSON (number is infinity",
            id="architecture-integer-of-5000-digits",
        ),
        pytest.param(
            _with_header(_meta(_nested(100_000).decode())), "policy architecture: nested deeper", id="architecture-deep"
        ),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": "{}"}, "__metadata__": {}}'),
            "duplicate object key",
            id="header-duplicate-key",
        ),
        pytest.param(
            _with_header(_meta('{"format": "ale-policy/v1", "format": "ale-policy/v1"}')),
            "duplicate object key",
            id="architecture-duplicate-key",
        ),
    ],
)
def test_a_header_that_is_hostile_json_is_refused_with_policy_error_not_a_crash(raw: bytes, needle: str) -> None:
    """Issue 10, point 13: deep nesting, a non-string ale-policy, 5000-digit integers: each a PolicyError."""
    with pytest.raises(PolicyError) as err:
        load_policy(raw)
    assert needle in str(err.value)
    assert len(str(err.value)) < 400


def test_a_parser_message_quoting_a_100k_character_value_is_cut() -> None:
    layer = {"weight": "w", "bias": "b", "activation": "x" * 100_000}
    with pytest.raises(PolicyError, match="policy architecture") as err:
        load_policy(_artifact(GOOD, _arch(layers=[layer])))
    assert len(str(err.value)) < 500
    assert str(err.value).endswith(" characters cut]")


def test_names_from_the_artifact_are_echoed_cut() -> None:
    long = "n" * 100_000
    raw = _artifact(GOOD, _arch(layers=[{"weight": long, "bias": "b", "activation": "identity"}]))
    with pytest.raises(PolicyError, match="is named in the architecture but missing") as err:
        load_policy(raw)
    assert "(100000 characters)" in str(err.value)
    assert len(str(err.value)) < 200
    spare = {**GOOD, **{f"{'x' * 5000}{i}": np.zeros(1) for i in range(20)}}
    with pytest.raises(PolicyError, match="20 tensors not used") as err:
        load_policy(_artifact(spare, _arch()))
    assert len(str(err.value)) < 800


@pytest.mark.fuzz
@fuzz_settings
@given(
    header=st.one_of(
        hostile_json,
        json_values.map(lambda v: json.dumps(v).encode()),
        json_values.map(lambda v: json.dumps({"__metadata__": {"ale-policy": v}}).encode()),
        json_values.map(lambda v: _meta(json.dumps(v))),
        hostile_json.map(lambda raw: _meta(raw.decode("utf-8", "replace"))),
    ),
    data=st.binary(max_size=64),
)
def test_fuzz_the_policy_parser_raises_only_policy_error(header: bytes, data: bytes) -> None:
    try:
        policy = load_policy(_with_header(header, data))
    except PolicyError as exc:
        message = str(exc)
        policy = None
    if policy is None:
        assert message
        assert len(message) < 2000
    else:
        assert policy.architecture.observation_dim >= 1


@pytest.mark.fuzz
@fuzz_settings
@given(
    arch=json_values
    | st.fixed_dictionaries(
        {"format": st.just("ale-policy/v1")},
        optional={
            "observation_dim": json_values,
            "normalizer": json_values,
            "layers": json_values,
            "output": json_values,
        },
    )
)
def test_fuzz_architectures_raise_only_policy_error(arch: object) -> None:
    with contextlib.suppress(PolicyError):
        load_policy(_artifact(GOOD, arch) if isinstance(arch, dict) else _with_header(_meta(json.dumps(arch))))


# -- a non-finite output aborts the episode, whatever the output kind ---------------------------------


def _overflowing(out: int, *, nan: bool = False) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """Two layers whose output overflows to +inf (or, with ``nan``, inf - inf) for any small observation."""
    w0, b0 = np.full((2, 3), 1.0), np.full(2, 1e200)
    w1 = np.full((out, 2), 1e200)
    if nan:
        w1[:, 1] = -1e200
    return [(w0, b0, "identity"), (w1, np.zeros(out), "identity")]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("nan", [False, True], ids=["inf", "nan"])
@pytest.mark.parametrize("output", ["clip", "tanh", "discrete"])
def test_a_non_finite_output_raises_before_clipping_squashing_or_argmax(output: str, nan: bool) -> None:
    """Issue 10, point 16: +inf was clipped to the bound, tanh(inf) is 1, argmax of [inf, inf] is 0."""
    policy = load_policy(save_policy(_overflowing(2, nan=nan), output=output))  # type: ignore[arg-type]
    obs = np.array([[0.1, -0.2, 0.3]])
    assert not np.all(np.isfinite(policy.forward(obs)))
    with pytest.raises(PolicyOutputError, match="not finite"):
        policy.act(obs, np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
    assert isinstance(PolicyOutputError("x"), PolicyError)
