"""Declarative policy artifacts (``ale-policy/v1``) for batch-mode evaluation.

A policy artifact is a `safetensors <https://github.com/huggingface/safetensors>`_
file: named little-endian tensors plus a ``__metadata__`` entry ``ale-policy``
holding a JSON architecture description. Nothing is unpickled and nothing
executes: the evaluator builds a feed-forward network from the description and
runs it in-process. docs/policy-format.md is the reference.

Architecture JSON::

    {"format": "ale-policy/v1",
     "observation_dim": 11,
     "normalizer": {"mean": "obs_mean", "std": "obs_std", "clip": 10.0},   # or null
     "layers": [{"weight": "w0", "bias": "b0", "activation": "tanh"}, ...],
     "output": {"kind": "box", "squash": "clip"}}    # or "tanh", or {"kind": "discrete"}

Layer ``k`` computes ``activation(W_k @ x + b_k)`` with ``W_k`` of shape
``[out, in]``. A linear policy is one layer with ``"identity"``. Box outputs
are clipped to the action bounds (``clip``) or mapped into them with
``low + (tanh(y) + 1) / 2 * (high - low)`` (``tanh``); a discrete output is
the arg-max (first on ties) plus the space's ``start``. An output that is not finite (NaN or
infinity, before any clipping, squashing or arg-max) raises :class:`PolicyOutputError`: the
evaluator aborts that episode with ``policy_error``, whatever the output kind.

The header and the architecture are untrusted JSON: both are read with the project's bounded
parser (``ale.core.parse.parse_json``) and every refusal is a :class:`PolicyError` whose message
echoes the artifact's values only through ``ale.protocol.echo``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from math import isfinite
from typing import Any, Literal

import attrs
import numpy as np
import safetensors.numpy

from ale.core.parse import ParseError, parse_json, structure
from ale.protocol import cut, echo

POLICY_FORMAT = "ale-policy/v1"
METADATA_KEY = "ale-policy"
MAX_POLICY_BYTES = 8 * 1024 * 1024
MAX_LAYERS = 8
MAX_WIDTH = 1024
MAX_PARAMETERS = 2_000_000
#: The safetensors header and the architecture JSON: at most 1 MiB each, nested at most 8 deep
#: (a valid header is 3 levels, ``{"name": {"shape": [...]}}``; an architecture is 3).
MAX_HEADER_BYTES = 1 << 20
MAX_JSON_DEPTH = 8
#: A parser's message can quote the artifact (a bad value, say): it is cut to this many characters.
MAX_REASON_CHARS = 400

Activation = Literal["identity", "tanh", "relu"]


class PolicyError(ValueError):
    """An artifact that is not a valid ale-policy/v1 policy; the text says why."""


class PolicyOutputError(PolicyError):
    """The network's output for an observation is not finite (NaN or infinity)."""


@attrs.frozen
class Normalizer:
    mean: str
    std: str
    clip: float


@attrs.frozen
class Layer:
    weight: str
    bias: str
    activation: Activation = attrs.field(validator=attrs.validators.in_(("identity", "tanh", "relu")))


@attrs.frozen
class Output:
    kind: Literal["box", "discrete"] = attrs.field(validator=attrs.validators.in_(("box", "discrete")))
    squash: Literal["clip", "tanh"] | None = None


@attrs.frozen
class Architecture:
    format: str = attrs.field(validator=attrs.validators.in_((POLICY_FORMAT,)))
    observation_dim: int
    normalizer: Normalizer | None
    layers: tuple[Layer, ...]
    output: Output


def _activate(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "tanh":
        return np.asarray(np.tanh(x))
    if kind == "relu":
        return np.asarray(np.maximum(x, 0.0))
    return x


@attrs.frozen(eq=False)
class Policy:
    """A loaded feed-forward policy; :meth:`act` maps observations to actions."""

    architecture: Architecture
    weights: tuple[tuple[np.ndarray, np.ndarray, str], ...]
    mean: np.ndarray | None
    std: np.ndarray | None
    # What every forward pass needs, looked up once: (W.T, b, activation) per layer, the
    # normalizer's (mean, std, clip) or None, the output kind and squash. The same operations
    # on the same arrays as spelling them out per call, so the results are identical.
    _layers: tuple[tuple[np.ndarray, np.ndarray, str], ...] = attrs.field(init=False, repr=False)
    _normalizer: tuple[np.ndarray, np.ndarray, float] | None = attrs.field(init=False, repr=False)
    _discrete: bool = attrs.field(init=False, repr=False)
    _tanh: bool = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        setattr_ = object.__setattr__  # the class is frozen
        setattr_(self, "_layers", tuple((w.T, b, act) for w, b, act in self.weights))
        norm = self.architecture.normalizer
        setattr_(
            self,
            "_normalizer",
            (self.mean, self.std, norm.clip)
            if norm is not None and self.mean is not None and self.std is not None
            else None,
        )
        setattr_(self, "_discrete", self.architecture.output.kind == "discrete")
        setattr_(self, "_tanh", self.architecture.output.squash == "tanh")

    @property
    def output_dim(self) -> int:
        return int(self.weights[-1][0].shape[0])

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """Raw network output for a batch ``[B, observation_dim]`` (float64)."""
        with np.errstate(all="ignore"):  # overflow gives inf/NaN, which the caller treats as a policy error
            return self._forward(np.asarray(obs, dtype=np.float64))

    def _forward(self, x: np.ndarray) -> np.ndarray:
        if self._normalizer is not None:
            mean, std, c = self._normalizer
            x = np.clip((x - mean) / std, -c, c)
        for wt, b, act in self._layers:
            x = x @ wt + b
            if act != "identity":
                x = _activate(x, act)
        return x

    def act(
        self, obs: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None, start: int = 0
    ) -> np.ndarray:
        """Actions for a batch of observations; ``low``/``high`` bound box outputs.

        Raises :class:`PolicyOutputError` if any raw output is NaN or infinite, before clipping,
        squashing or the arg-max could hide it."""
        y = self.forward(obs)
        if not all(map(isfinite, y.ravel().tolist())):  # math.isfinite: far cheaper than numpy on a few floats
            raise PolicyOutputError("the policy's output is not finite (NaN or infinity)")
        if self._discrete:
            return np.asarray(y.argmax(axis=-1) + start, dtype=np.int64)
        if low is None or high is None:
            raise PolicyError("a box policy needs the action bounds")
        if self._tanh:
            with np.errstate(all="ignore"):
                return np.asarray(low + (np.tanh(y) + 1.0) / 2.0 * (high - low))
        return np.asarray(np.clip(y, low, high))


def _read_architecture(raw: bytes) -> str:
    """The ``__metadata__["ale-policy"]`` string of a safetensors file, header checked."""
    if len(raw) < 8:
        raise PolicyError("too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", raw[:8])
    if header_len > min(len(raw) - 8, MAX_HEADER_BYTES):
        raise PolicyError("safetensors header length is out of range")
    try:
        header = parse_json(
            raw[8 : 8 + header_len], what="safetensors header", max_bytes=MAX_HEADER_BYTES, max_depth=MAX_JSON_DEPTH
        )
    except ParseError as exc:
        raise PolicyError(cut(str(exc), MAX_REASON_CHARS)) from None
    if not isinstance(header, dict):
        raise PolicyError("safetensors header is not a JSON object")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict):
        raise PolicyError(f"no {METADATA_KEY!r} entry in the safetensors __metadata__")
    if METADATA_KEY not in meta:
        raise PolicyError(f"no {METADATA_KEY!r} entry in the safetensors __metadata__")
    arch = meta[METADATA_KEY]
    if not isinstance(arch, str):
        raise PolicyError(
            f"__metadata__[{METADATA_KEY!r}] is a JSON {_json_type(arch)}; it must be a string holding the architecture"
        )
    return arch


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def load_policy(raw: bytes, *, max_bytes: int = MAX_POLICY_BYTES) -> Policy:
    """Parse and check an artifact; raise PolicyError with the reason on anything wrong."""
    if len(raw) > max_bytes:
        raise PolicyError(f"policy artifact is {len(raw)} bytes; the limit is {max_bytes}")
    text = _read_architecture(raw)
    try:
        value = parse_json(text, what="policy architecture", max_bytes=MAX_HEADER_BYTES, max_depth=MAX_JSON_DEPTH)
        arch = structure(value, Architecture, what="policy architecture")
    except ParseError as exc:
        raise PolicyError(cut(str(exc), MAX_REASON_CHARS)) from None
    try:
        tensors = safetensors.numpy.load(raw)
    except Exception as exc:  # the library raises several types for a corrupt file
        raise PolicyError(f"not a valid safetensors file: {echo(str(exc), 200)}") from None
    return _build(arch, tensors)


def _tensor(tensors: Mapping[str, np.ndarray], name: str, ndim: int) -> np.ndarray:
    if name not in tensors:
        raise PolicyError(f"tensor {echo(name)} is named in the architecture but missing")
    t = tensors[name]
    if t.dtype not in (np.float32, np.float64):
        raise PolicyError(f"tensor {echo(name)} is {t.dtype}; only float32 and float64 are allowed")
    if t.ndim != ndim:
        raise PolicyError(f"tensor {echo(name)} has {t.ndim} dimensions, expected {ndim}")
    if not np.all(np.isfinite(t)):
        raise PolicyError(f"tensor {echo(name)} holds NaN or infinity")
    return t.astype(np.float64)


def _check_shape(arch: Architecture) -> None:
    if not 1 <= arch.observation_dim <= MAX_WIDTH:
        raise PolicyError(f"observation_dim must be 1..{MAX_WIDTH}")
    if not 1 <= len(arch.layers) <= MAX_LAYERS:
        raise PolicyError(f"a policy has 1..{MAX_LAYERS} layers, not {len(arch.layers)}")
    if arch.output.kind == "box" and arch.output.squash not in ("clip", "tanh"):
        raise PolicyError('a box output needs "squash": "clip" or "tanh"')
    if arch.output.kind == "discrete" and arch.output.squash is not None:
        raise PolicyError("a discrete output takes no squash")


def _normalizer(arch: Architecture, tensors: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, np.ndarray | None]:
    if arch.normalizer is None:
        return None, None
    if not (math.isfinite(arch.normalizer.clip) and arch.normalizer.clip > 0):
        raise PolicyError("normalizer clip must be a finite positive number")
    mean = _tensor(tensors, arch.normalizer.mean, 1)
    std = _tensor(tensors, arch.normalizer.std, 1)
    if mean.shape != (arch.observation_dim,) or std.shape != (arch.observation_dim,):
        raise PolicyError("normalizer mean and std must have shape [observation_dim]")
    if np.any(std <= 0):
        raise PolicyError("normalizer std must be positive")
    return mean, std


def _layers(arch: Architecture, tensors: Mapping[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, str]]:
    layers: list[tuple[np.ndarray, np.ndarray, str]] = []
    width, params = arch.observation_dim, 0
    for i, layer in enumerate(arch.layers):
        w = _tensor(tensors, layer.weight, 2)
        b = _tensor(tensors, layer.bias, 1)
        if w.shape[1] != width:
            raise PolicyError(f"layer {i}: weight takes {w.shape[1]} inputs, the previous layer gives {width}")
        if not 1 <= w.shape[0] <= MAX_WIDTH or b.shape != (w.shape[0],):
            raise PolicyError(f"layer {i}: weight {list(w.shape)} and bias {list(b.shape)} do not fit")
        width = int(w.shape[0])
        params += w.size + b.size
        layers.append((w, b, layer.activation))
    if params > MAX_PARAMETERS:
        raise PolicyError(f"{params} parameters exceeds the limit of {MAX_PARAMETERS}")
    return layers


def _build(arch: Architecture, tensors: Mapping[str, np.ndarray]) -> Policy:
    _check_shape(arch)
    mean, std = _normalizer(arch, tensors)
    layers = _layers(arch, tensors)
    used = {n for layer in arch.layers for n in (layer.weight, layer.bias)}
    if arch.normalizer is not None:
        used |= {arch.normalizer.mean, arch.normalizer.std}
    extra = sorted(set(tensors) - used)
    if extra:
        shown = ", ".join(echo(name) for name in extra[:5])
        raise PolicyError(f"{len(extra)} tensors not used by the architecture: {shown}")
    return Policy(architecture=arch, weights=tuple(layers), mean=mean, std=std)


def save_policy(
    layers: Sequence[tuple[np.ndarray, np.ndarray, str]],
    *,
    output: Literal["clip", "tanh", "discrete"],
    normalizer: tuple[np.ndarray, np.ndarray, float] | None = None,
) -> bytes:
    """Write an artifact from ``(weight [out, in], bias [out], activation)`` layers."""
    tensors: dict[str, np.ndarray] = {}
    arch_layers: list[dict[str, Any]] = []
    for i, (w, b, act) in enumerate(layers):
        tensors[f"layer{i}.weight"] = np.ascontiguousarray(w, dtype=np.float64)
        tensors[f"layer{i}.bias"] = np.ascontiguousarray(b, dtype=np.float64)
        arch_layers.append({"weight": f"layer{i}.weight", "bias": f"layer{i}.bias", "activation": act})
    arch: dict[str, Any] = {
        "format": POLICY_FORMAT,
        "observation_dim": int(np.shape(layers[0][0])[1]),
        "normalizer": None,
        "layers": arch_layers,
        "output": {"kind": "discrete"} if output == "discrete" else {"kind": "box", "squash": output},
    }
    if normalizer is not None:
        mean, std, clip = normalizer
        tensors["obs_mean"] = np.ascontiguousarray(mean, dtype=np.float64)
        tensors["obs_std"] = np.ascontiguousarray(std, dtype=np.float64)
        arch["normalizer"] = {"mean": "obs_mean", "std": "obs_std", "clip": float(clip)}
    raw = safetensors.numpy.save(tensors, metadata={METADATA_KEY: json.dumps(arch, sort_keys=True)})
    load_policy(raw)  # never hand out an artifact the evaluator would refuse
    return raw


def linear_policy(
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    output: Literal["clip", "tanh", "discrete"] = "clip",
) -> bytes:
    """A one-layer (linear) policy artifact."""
    w = np.atleast_2d(np.asarray(weight, dtype=np.float64))
    b = np.zeros(w.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    return save_policy([(w, b, "identity")], output=output)
