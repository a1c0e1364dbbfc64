"""The evaluator's refusals: the one exception the service layer turns into a gRPC status.

A handler ends in one of three ways: a reply; an :class:`RpcError` (the request is refused, its
code and message go to the client); or any other exception, which is an evaluator bug (INTERNAL,
logged with its traceback, and the client learns nothing of it). The codecs below the service
raise their own errors for bad input (``ale.protocol.ProtocolError``, ``ale.policy.PolicyError``);
:func:`refusal` is the one place that says those are the caller's fault.
"""

from __future__ import annotations

import grpc

from ale.policy import PolicyError
from ale.protocol import ProtocolError, cut

#: The longest status message the evaluator sends (gRPC carries it in a header, limited to 8-16 KiB
#: in total). Values a caller chose are already cut by ``ale.protocol.echo``; this is the backstop.
MAX_STATUS_CHARS = 1024


class RpcError(Exception):
    """A request the evaluator refuses; ``code`` and ``message`` go to the client as-is.

    Messages are written for the client and must never contain a hidden seed
    or the evaluator secret; values the client sent appear only through ``echo``.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        message = cut(message, MAX_STATUS_CHARS)
        super().__init__(message)
        self.code = code
        self.message = message


def refusal(exc: Exception) -> RpcError | None:
    """The refusal ``exc`` stands for, or None when it is a bug (anything not the caller's fault)."""
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, (ProtocolError, PolicyError)):
        return invalid(str(exc))
    return None


def invalid(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.NOT_FOUND, message)


def precondition(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.FAILED_PRECONDITION, message)


def denied(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.PERMISSION_DENIED, message)


def exhausted(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
