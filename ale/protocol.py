"""Typed tensors, spaces and requests for the ale.env.v1 protocol (protobuf messages, no I/O).

Shared by the evaluator and the agent's client. Decoding is strict and raises only
:class:`ProtocolError`, with a message meant for the peer that sent it: a request that is not
its message type or carries an id longer than :data:`MAX_ID_CHARS` (:func:`decode_request`); a
tensor with an unknown dtype, more than 8 dimensions, a dimension outside
``[0, MAX_TENSOR_ELEMENTS]``, more elements than that, a shape other than the one expected, or
data whose byte length does not match (:func:`decode_tensor`). Whatever a message echoes of the
peer's input goes through :func:`echo`, so no value reaches a status message or a log whole.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from google.protobuf.message import DecodeError, Message

from ale.env.v1 import env_pb2 as pb

if TYPE_CHECKING:
    import gymnasium as gym

SERVICE_NAME = "ale.env.v1.AleEnv"
PROTOCOL_VERSION = "ale.env.v1"
#: The largest message either side accepts (a policy artifact fits well inside).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: The most elements one tensor may hold (guards the decode allocation), and so the largest dimension.
MAX_TENSOR_ELEMENTS = 4 * 1024 * 1024
MAX_TENSOR_DIMENSIONS = 8
#: The longest id a request may carry (``env_id``, ``session_id``, ``batch_id``, ``task_id``);
#: the evaluator's own ids are 36 to 40 characters.
MAX_ID_CHARS = 128
ID_FIELDS = ("env_id", "session_id", "batch_id", "task_id")
#: How many characters of a peer's value a message shows (:func:`echo`).
ECHO_CHARS = 64

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

M = TypeVar("M", bound=Message)


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} characters cut]"


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` as a message may show it: its ``repr`` when short, else the ``repr`` of its first
    ``limit`` characters (or bytes) followed by ``... (N characters)``. Every value a peer chose
    (ids, names, numbers) goes through this before it reaches a status message or an event."""
    if isinstance(value, (str, bytes)):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"an integer of {value.bit_length()} bits"  # str() of a huge int is slow, or refused
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class ProtocolError(ValueError):
    """A message does not follow the protocol; the text says how."""


def dtype_enum(dtype: np.dtype) -> pb.DType:
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
    msg.dtype = code
    msg.shape[:] = array.shape
    msg.data = np.ascontiguousarray(array, dtype=wire).tobytes()
    return msg


def decode_tensor(msg: pb.Tensor, *, what: str = "tensor", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Decode a Tensor message into a native-endian, writable numpy array of ``shape`` (if given).

    Every dimension is bounded before anything is computed from it, so no shape, however
    chosen (``[0, 2**63 - 1]`` holds no elements), can reach numpy's reshape unchecked.
    """
    code = msg.dtype
    dtype = _TO_NUMPY.get(code)
    if dtype is None:
        if not code:
            raise ProtocolError(f"{what}: dtype is unspecified")
        raise ProtocolError(f"{what}: unknown tensor dtype {echo(code)}")
    dims = tuple(msg.shape)
    if len(dims) > MAX_TENSOR_DIMENSIONS:
        raise ProtocolError(f"{what}: {len(dims)} dimensions (at most {MAX_TENSOR_DIMENSIONS})")
    count = 1
    for d in dims:
        if d < 0:
            raise ProtocolError(f"{what}: negative dimension in shape {list(dims)}")
        if d > MAX_TENSOR_ELEMENTS:
            raise ProtocolError(f"{what}: dimension {d} in shape {list(dims)} exceeds the limit {MAX_TENSOR_ELEMENTS}")
        count *= d
        if count > MAX_TENSOR_ELEMENTS:
            raise ProtocolError(f"{what}: shape {list(dims)} exceeds the limit of {MAX_TENSOR_ELEMENTS} elements")
    if shape is not None and dims != shape:
        raise ProtocolError(f"{what} has shape {list(dims)}; expected {list(shape)}")
    data = msg.data
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(f"{what}: {len(data)} data bytes, but shape {list(dims)} of {dtype.name} needs {expected}")
    return np.frombuffer(data, dtype=dtype).astype(_NATIVE[code], copy=True).reshape(dims)


def parse_request(cls: type[M], raw: bytes) -> M:
    """The message of type ``cls`` that ``raw`` holds, or ProtocolError (fields not yet checked)."""
    try:
        msg: M = cls.FromString(raw)
    except (DecodeError, RuntimeWarning, ValueError):
        raise ProtocolError(f"the request is not a valid {cls.DESCRIPTOR.full_name}") from None
    return msg


@functools.cache
def _id_fields(descriptor: Any) -> tuple[str, ...]:
    return tuple(name for name in ID_FIELDS if name in descriptor.fields_by_name)


def check_request(msg: Message) -> None:
    """Raise ProtocolError if an id field of ``msg`` is longer than :data:`MAX_ID_CHARS`."""
    for name in _id_fields(msg.DESCRIPTOR):
        value = getattr(msg, name)
        if len(value) > MAX_ID_CHARS:
            raise ProtocolError(f"{name} {echo(value)} is longer than {MAX_ID_CHARS} characters")


def decode_request(cls: type[M], raw: bytes) -> M:
    """Parse and check one request: the message, or ProtocolError saying what is wrong."""
    msg = parse_request(cls, raw)
    check_request(msg)
    return msg


def encode_space(space: gym.Space[Any], out: pb.Space | None = None) -> pb.Space:
    """Encode a Box or Discrete space; other spaces are not part of v1."""
    import gymnasium as gym  # here, so that the harness's RPC client loads without it

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
    import gymnasium as gym

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
