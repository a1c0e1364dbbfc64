"""gRPC server reflection in both versions: ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection ships only v1alpha, but current grpcurl, Postman and grpc-java ask for v1
first. The two protocols are the same messages under another package name
(``grpc/reflection/v1/reflection.proto`` is v1alpha's file with ``package grpc.reflection.v1``),
so their wire bytes are identical: v1 is served by the library's own servicer, its requests and
replies read and written with the v1alpha classes. The v1 file descriptor is built from the
v1alpha one (package and type names renamed) and added to the descriptor pool, so that v1 can
describe itself too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA_SERVICE = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """v1alpha's file descriptor under the v1 package and file name."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old = f".{proto.package}."
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.ClearField("options")
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = f".{V1_PACKAGE}." + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = f".{V1_PACKAGE}." + method.input_type[len(old) :]
            method.output_type = f".{V1_PACKAGE}." + method.output_type[len(old) :]
    return proto


def register_v1_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> None:
    """Add the v1 reflection file to ``pool`` (the default pool) unless it is there already."""
    pool = pool or descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.Add(_v1_file())


def enable_server_reflection(service_names: Iterable[str], server: grpc.Server) -> None:
    """Serve reflection v1 and v1alpha on ``server``; both list ``service_names`` and themselves."""
    register_v1_descriptor()
    names = sorted({*service_names, V1_SERVICE, V1ALPHA_SERVICE})
    servicer = reflection.ReflectionServicer(names)

    def info(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        replies: Iterator[Any] = servicer.ServerReflectionInfo(requests, context)
        return replies

    handler = grpc.stream_stream_rpc_method_handler(
        info,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": handler}),
            grpc.method_handlers_generic_handler(V1ALPHA_SERVICE, {"ServerReflectionInfo": handler}),
        ]
    )
