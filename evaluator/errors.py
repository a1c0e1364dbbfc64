"""The one exception the service layer turns into a gRPC status."""

from __future__ import annotations

import grpc


class RpcError(Exception):
    """A request the evaluator refuses; ``code`` and ``message`` go to the client as-is.

    Messages are written for the client and must never contain a hidden seed
    or the evaluator secret.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
