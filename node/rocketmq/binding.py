"""How `MessagingService` is bound to a gRPC server: every request arrives as bytes and is
decoded in its handler, so one that does not decode answers ``BAD_REQUEST`` in its status, as
any refusal does, instead of grpcio's ``UNKNOWN`` and a logged traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from tickwheel.node.api.admission import CallContext
from tickwheel.node.rocketmq.convert import Refusal
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.rocketmq.v2 import service_pb2 as svc

Context = CallContext
"""What `MessagingService` uses of a call's context."""
SERVICE_NAME = svc.DESCRIPTOR.services_by_name["MessagingService"].full_name
MessageT = TypeVar("MessageT", bound=Message)
RequestT = TypeVar("RequestT", bound=Message)
ResponseT = TypeVar("ResponseT", bound=Message)


def decode(message_class: type[MessageT], data: bytes) -> MessageT:
    try:
        return message_class.FromString(data)
    except DecodeError as error:
        raise Refusal(rmq.Code.BAD_REQUEST, f"request: could not be decoded: {error}") from None


def add_messaging_service(service: object, server: grpc.aio.Server) -> None:
    """Bind every RPC of ``MessagingService``: requests arrive as bytes and are decoded in the
    handler (a request that does not decode answers ``BAD_REQUEST`` in its status, as any
    refusal does, instead of grpcio's ``UNKNOWN`` and a logged traceback)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}  # as grpc holds them
    for method in svc.DESCRIPTOR.services_by_name["MessagingService"].methods:
        handler = getattr(service, method.name)
        request_class = getattr(svc, method.input_type.name)
        response_class = getattr(svc, method.output_type.name)
        encode = response_class.SerializeToString
        if method.client_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                handler, response_serializer=encode)
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _streaming(handler, request_class, response_class),
                response_serializer=encode)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(handler, request_class, response_class), response_serializer=encode)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _unary(handler: Callable[[RequestT, Context], Awaitable[ResponseT]],
           request_class: type[RequestT], response_class: type[ResponseT]
           ) -> Callable[[bytes, Context], Awaitable[ResponseT]]:
    async def handle(data: bytes, context: Context) -> ResponseT:
        try:
            return await handler(decode(request_class, data), context)
        except Refusal as refusal:
            return response_class(status=refusal.status())
    return handle


def _streaming(handler: Callable[[RequestT, Context], AsyncIterator[ResponseT]],
               request_class: type[RequestT], response_class: type[ResponseT]
               ) -> Callable[[bytes, Context], AsyncIterator[ResponseT]]:
    async def handle(data: bytes, context: Context) -> AsyncIterator[ResponseT]:
        try:
            request = decode(request_class, data)
        except Refusal as refusal:
            yield response_class(status=refusal.status())
            return
        async for response in handler(request, context):
            yield response
    return handle
