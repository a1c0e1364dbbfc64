"""Typed tensors and spaces for the ale.env.v1 protocol (protobuf messages, no I/O).

Shared by the evaluator and the agent's client. Decoding is strict: a tensor
whose byte length does not match its dtype and shape, an unknown dtype, or a
negative dimension raises :class:`ProtocolError` with a message meant for the
peer that sent it.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from ale.env.v1 import env_pb2 as pb

SERVICE_NAME = "ale.env.v1.AleEnv"
PROTOCOL_VERSION = "ale.env.v1"
#: The largest message either side accepts (a policy artifact fits well inside).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: The most elements one tensor may hold (guards the decode allocation).
MAX_TENSOR_ELEMENTS = 4 * 1024 * 1024

_TO_NUMPY: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_UINT8: np.dtype("u1"),
    pb.DTYPE_BOOL: np.dtype("?"),
}
#: The same dtypes in this machine's byte order: what decoded arrays are.
_NATIVE: dict[int, np.dtype] = {code: dtype.newbyteorder("=") for code, dtype in _TO_NUMPY.items()}
_FROM_KIND = {
    ("f", 4): pb.DTYPE_FLOAT32,
    ("f", 8): pb.DTYPE_FLOAT64,
    ("i", 4): pb.DTYPE_INT32,
    ("i", 8): pb.DTYPE_INT64,
    ("u", 1): pb.DTYPE_UINT8,
    ("b", 1): pb.DTYPE_BOOL,
}


class ProtocolError(ValueError):
    """A message does not follow the protocol; the text says how."""


def dtype_enum(dtype: np.dtype) -> int:
    """The protocol DType for a numpy dtype, or ProtocolError."""
    try:
        return _FROM_KIND[(dtype.kind, dtype.itemsize)]
    except KeyError:
        raise ProtocolError(f"dtype {dtype} has no protocol equivalent") from None


def numpy_dtype(value: int) -> np.dtype:
    """The little-endian numpy dtype for a protocol DType, or ProtocolError."""
    try:
        return _TO_NUMPY[value]
    except KeyError:
        raise ProtocolError(f"unknown tensor dtype {value}") from None


def encode_tensor(array: np.ndarray, out: pb.Tensor | None = None) -> pb.Tensor:
    """Encode ``array`` as raw little-endian C-order bytes."""
    array = np.asarray(array)
    code = dtype_enum(array.dtype)
    wire = _TO_NUMPY[code]
    msg = pb.Tensor() if out is None else out
    msg.dtype = code  # type: ignore[assignment]
    msg.shape[:] = array.shape
    msg.data = np.ascontiguousarray(array, dtype=wire).tobytes()
    return msg


def decode_tensor(msg: pb.Tensor, *, what: str = "tensor") -> np.ndarray:
    """Decode a Tensor message into a native-endian, writable numpy array."""
    code = msg.dtype
    dtype = _TO_NUMPY.get(code)
    if dtype is None:
        if not code:
            raise ProtocolError(f"{what}: dtype is unspecified")
        raise ProtocolError(f"{what}: unknown tensor dtype {code}")
    shape = tuple(msg.shape)
    if shape and min(shape) < 0:
        raise ProtocolError(f"{what}: negative dimension in shape {list(shape)}")
    if len(shape) > 8:
        raise ProtocolError(f"{what}: {len(shape)} dimensions (at most 8)")
    count = math.prod(shape)
    if count > MAX_TENSOR_ELEMENTS:
        raise ProtocolError(f"{what}: {count} elements exceeds the limit {MAX_TENSOR_ELEMENTS}")
    data = msg.data
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(f"{what}: {len(data)} data bytes, but shape {list(shape)} of {dtype.name} needs {expected}")
    return np.frombuffer(data, dtype=dtype).astype(_NATIVE[code], copy=True).reshape(shape)


def encode_space(space: gym.Space[Any], out: pb.Space | None = None) -> pb.Space:
    """Encode a Box or Discrete space; other spaces are not part of v1."""
    msg = pb.Space() if out is None else out
    if isinstance(space, gym.spaces.Box):
        encode_tensor(space.low, msg.box.low)
        encode_tensor(space.high, msg.box.high)
    elif isinstance(space, gym.spaces.Discrete):
        msg.discrete.n = int(space.n)
        msg.discrete.start = int(space.start)
    else:
        raise ProtocolError(f"space {space!r} is not a Box or Discrete")
    return msg


def decode_space(msg: pb.Space) -> gym.spaces.Box | gym.spaces.Discrete:
    """Decode a Space message into a gymnasium space."""
    kind = msg.WhichOneof("space")
    if kind == "box":
        low = decode_tensor(msg.box.low, what="box.low")
        high = decode_tensor(msg.box.high, what="box.high")
        if low.shape != high.shape or low.dtype != high.dtype:
            raise ProtocolError("box space: low and high differ in shape or dtype")
        return gym.spaces.Box(low=low, high=high, shape=low.shape, dtype=low.dtype)
    if kind == "discrete":
        if msg.discrete.n <= 0:
            raise ProtocolError("discrete space: n must be positive")
        return gym.spaces.Discrete(int(msg.discrete.n), start=int(msg.discrete.start))
    raise ProtocolError("space: neither box nor discrete")
