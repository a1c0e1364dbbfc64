"""Typed tensors and spaces on the wire: exact round trips and strict decoding."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from fuzzing import fuzz_settings
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ale.env.v1 import env_pb2 as pb
from ale.protocol import (
    ECHO_CHARS,
    ID_FIELDS,
    MAX_ID_CHARS,
    MAX_TENSOR_DIMENSIONS,
    MAX_TENSOR_ELEMENTS,
    ProtocolError,
    decode_request,
    decode_space,
    decode_tensor,
    echo,
    encode_space,
    encode_tensor,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
REQUESTS = [
    pb.CreateEnvRequest,
    pb.GetSpecRequest,
    pb.ResetRequest,
    pb.StepRequest,
    pb.StartEvalSessionRequest,
    pb.GetEvalResultRequest,
    pb.SubmitBatchEvalRequest,
    pb.GetBatchEvalStatusRequest,
]

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_]


@settings(max_examples=150, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(DTYPES),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_tensors_round_trip_bit_exactly(array: np.ndarray) -> None:
    msg = pb.Tensor.FromString(encode_tensor(array).SerializeToString())
    back = decode_tensor(msg)
    assert back.shape == array.shape
    assert back.dtype == array.dtype
    assert back.tobytes() == array.tobytes()  # NaN payloads and -0.0 included


def test_wire_bytes_are_little_endian_whatever_the_input_order() -> None:
    big = np.array([1.0, 2.0], dtype=">f8")
    assert encode_tensor(big).data == np.array([1.0, 2.0], dtype="<f8").tobytes()


@pytest.mark.parametrize(
    ("msg", "needle"),
    [
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2], data=b"\x00" * 7), "data bytes"),
        (pb.Tensor(dtype=pb.DTYPE_UNSPECIFIED, shape=[1], data=b"\x00"), "unspecified"),
        (pb.Tensor(dtype=99, shape=[1], data=b"\x00"), "unknown tensor dtype"),
        (pb.Tensor(dtype=pb.DTYPE_UINT8, shape=[-1], data=b""), "negative"),
        (pb.Tensor(dtype=pb.DTYPE_UINT8, shape=[1] * 9, data=b"\x00"), "dimensions"),
        (pb.Tensor(dtype=pb.DTYPE_UINT8, shape=[MAX_TENSOR_ELEMENTS + 1], data=b""), "exceeds the limit"),
        (pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[2**31, 2**31], data=b""), "exceeds the limit"),
    ],
)
def test_malformed_tensors_are_refused_clearly(msg: pb.Tensor, needle: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode_tensor(msg, what="action")
    assert needle in str(err.value)
    assert "action" in str(err.value)


def test_unsupported_dtype_is_refused_on_encode() -> None:
    with pytest.raises(ProtocolError):
        encode_tensor(np.zeros(2, dtype=np.complex64))


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
        gym.spaces.Box(low=np.array([-np.inf, 0.0]), high=np.array([np.inf, 5.0]), dtype=np.float64),
        gym.spaces.Discrete(2),
        gym.spaces.Discrete(7, start=-3),
    ],
)
def test_spaces_round_trip(space: gym.Space) -> None:
    back = decode_space(pb.Space.FromString(encode_space(space).SerializeToString()))
    assert back == space


def test_bad_spaces_are_refused() -> None:
    with pytest.raises(ProtocolError, match="neither"):
        decode_space(pb.Space())
    with pytest.raises(ProtocolError, match="positive"):
        decode_space(pb.Space(discrete=pb.DiscreteSpace(n=0)))
    msg = pb.Space()
    encode_tensor(np.zeros(2, dtype=np.float32), msg.box.low)
    encode_tensor(np.zeros(3, dtype=np.float32), msg.box.high)
    with pytest.raises(ProtocolError, match="differ"):
        decode_space(msg)
    with pytest.raises(ProtocolError, match="Box or Discrete"):
        encode_space(gym.spaces.MultiBinary(3))


# -- the one tensor decoder: every shape bounded before anything is computed from it ------------------


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param([0, 2**63 - 1], id="zero-by-int64-max"),
        pytest.param([2**63 - 1, 0], id="int64-max-by-zero"),
        pytest.param([0, MAX_TENSOR_ELEMENTS + 1], id="zero-by-one-past-the-limit"),
        pytest.param([1, 0, 2**40, 3], id="zero-inside"),
    ],
)
def test_a_zero_element_tensor_with_a_huge_dimension_is_refused_before_reshape(shape: list[int]) -> None:
    """Issue 10, point 12: [0, 2**63-1] holds no elements, so byte counts pass; numpy's reshape raised."""
    for dtype in (pb.DTYPE_FLOAT32, pb.DTYPE_INT64, pb.DTYPE_BOOL):
        with pytest.raises(ProtocolError, match="exceeds the limit") as err:
            decode_tensor(pb.Tensor(dtype=dtype, shape=shape, data=b""), what="action")
        assert str(err.value).startswith("action: ")


def test_every_dimension_up_to_the_limit_decodes() -> None:
    assert decode_tensor(pb.Tensor(dtype=pb.DTYPE_UINT8, shape=[0, MAX_TENSOR_ELEMENTS])).shape == (
        0,
        MAX_TENSOR_ELEMENTS,
    )
    assert decode_tensor(pb.Tensor(dtype=pb.DTYPE_UINT8, shape=[1] * MAX_TENSOR_DIMENSIONS, data=b"\x07")).shape == (
        (1,) * MAX_TENSOR_DIMENSIONS
    )


def test_the_decoder_refuses_a_shape_other_than_the_expected_one() -> None:
    msg = encode_tensor(np.zeros((2, 3), dtype=np.float32))
    assert decode_tensor(msg, shape=(2, 3)).shape == (2, 3)
    for expected in [(3, 2), (6,), (2, 3, 1), (1, 2, 3)]:
        with pytest.raises(ProtocolError, match=r"action has shape \[2, 3\]; expected"):
            decode_tensor(msg, what="action", shape=expected)


@pytest.mark.fuzz
@fuzz_settings
@given(
    dtype=st.integers(min_value=-(2**31), max_value=2**31 - 1) | st.sampled_from(range(7)),
    shape=st.lists(INT64 | st.integers(-2, 6), max_size=MAX_TENSOR_DIMENSIONS + 2),
    data=st.binary(max_size=96),
    expected=st.none() | st.lists(st.integers(0, 6), max_size=4).map(tuple),
)
def test_fuzz_the_tensor_decoder_gives_an_array_of_the_declared_shape_or_protocol_error(
    dtype: int, shape: list[int], data: bytes, expected: tuple[int, ...] | None
) -> None:
    msg = pb.Tensor(dtype=dtype, shape=shape, data=data)
    try:
        array = decode_tensor(pb.Tensor.FromString(msg.SerializeToString()), shape=expected)
    except ProtocolError as exc:
        message = str(exc)
        array = None
    if array is None:
        assert len(message) < 400  # a short message, whatever the shape
        return
    assert array.shape == tuple(shape)
    assert expected is None or array.shape == expected
    assert array.nbytes == len(data)
    assert all(0 <= d <= MAX_TENSOR_ELEMENTS for d in shape)


# -- the request decoder: the message type, and every id bounded -------------------------------------


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_an_id_longer_than_the_limit_is_refused_by_the_request_decoder(cls) -> None:
    fields = [name for name in ID_FIELDS if name in cls.DESCRIPTOR.fields_by_name]
    for name in fields:
        ok = cls(**{name: "x" * MAX_ID_CHARS})
        assert getattr(decode_request(cls, ok.SerializeToString()), name) == "x" * MAX_ID_CHARS
        long = cls(**{name: "x" * (20 * 1024)})
        with pytest.raises(ProtocolError) as err:
            decode_request(cls, long.SerializeToString())
        message = str(err.value)
        assert message.startswith(f"{name} ")
        assert "(20480 characters)" in message
        assert f"longer than {MAX_ID_CHARS}" in message
        assert len(message) < 200


def test_undecodable_request_bytes_are_refused_naming_the_message() -> None:
    with pytest.raises(ProtocolError, match=r"not a valid ale\.env\.v1\.StepRequest"):
        decode_request(pb.StepRequest, b"\xff" * 11)


@pytest.mark.fuzz
@fuzz_settings
@given(cls=st.sampled_from(REQUESTS), raw=st.binary(max_size=300), long_id=st.integers(0, 300))
def test_fuzz_the_request_decoder_gives_a_bounded_message_or_protocol_error(cls, raw: bytes, long_id: int) -> None:
    fields = [name for name in ID_FIELDS if name in cls.DESCRIPTOR.fields_by_name]
    if fields and long_id > 150:  # half the time, append an id field of a random length
        raw += cls(**{fields[long_id % len(fields)]: "é" * long_id}).SerializeToString()
    try:
        msg = decode_request(cls, raw)
    except ProtocolError as exc:
        message = str(exc)
        msg = None
    if msg is None:
        assert len(message) < 300
        return
    assert isinstance(msg, cls)
    assert all(len(getattr(msg, name)) <= MAX_ID_CHARS for name in fields)


# -- echo: how much of a caller's value a message shows -------------------------------------------------


def test_echo_shows_a_short_value_whole_and_a_long_one_cut_with_its_length() -> None:
    assert echo("env-1") == "'env-1'"
    assert echo("a" * ECHO_CHARS) == repr("a" * ECHO_CHARS)
    long = echo("a" * (1200 * 1024))
    assert long == repr("a" * ECHO_CHARS) + "... (1228800 characters)"
    assert echo(b"\x00" * 100).endswith("... (100 bytes)")
    assert echo(10**5000) == "an integer of 16610 bits"  # str() of it would raise ValueError
    assert echo(7) == "7"
    assert len(echo(list(range(1000)))) < 120
