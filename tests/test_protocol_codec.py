"""Typed tensors and spaces on the wire: exact round trips and strict decoding."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ale.env.v1 import env_pb2 as pb
from ale.protocol import MAX_TENSOR_ELEMENTS, ProtocolError, decode_space, decode_tensor, encode_space, encode_tensor

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
