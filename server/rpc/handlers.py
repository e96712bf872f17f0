"""The handlers of TEI's services, made from the protocol's descriptor rather than by the
generated ``add_*Servicer_to_server``, so that the bytes of a call are checked at the edge: a
message that does not parse as the method's input type (a string field of bad UTF-8, a field
of the wrong wire type, a length past the end) is answered INVALID_ARGUMENT, naming the type
and what the parser said, instead of the UNKNOWN status and Python exception text gRPC gives
a deserializer that raises."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from bertserve.client.tei import tei_pb2 as pb
from google.protobuf.message import DecodeError

from .status import CallError


class Undecodable:
    """What a call's bytes are when they are no message of its input type."""

    def __init__(self, type_name: str, problem: str) -> None:
        self.type_name, self.problem = type_name, problem

    def error(self) -> CallError:
        return CallError(
            grpc.StatusCode.INVALID_ARGUMENT, f"the message is not a valid {self.type_name}: {self.problem}"
        )


def tei_handlers(servicers: dict[str, Any]) -> list[grpc.GenericRpcHandler]:
    """A generic handler for each of TEI's services, its methods those of ``servicers[name]``."""
    handlers = []
    for service in pb.DESCRIPTOR.services_by_name.values():
        servicer = servicers[service.name]
        methods = {method.name: _handler(method, getattr(servicer, method.name)) for method in service.methods}
        handlers.append(grpc.method_handlers_generic_handler(service.full_name, methods))
    return handlers


def _handler(method: Any, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    request_type = getattr(pb, method.input_type.name)
    response_type = getattr(pb, method.output_type.name)
    parse = _parser(request_type)
    serialize = response_type.SerializeToString
    streams_in, streams_out = method.client_streaming, method.server_streaming
    if not streams_in:
        behavior = _checked_unary(behavior, streams_out)
        make = grpc.unary_stream_rpc_method_handler if streams_out else grpc.unary_unary_rpc_method_handler
    else:
        behavior = _checked_stream(behavior, streams_out)
        make = grpc.stream_stream_rpc_method_handler if streams_out else grpc.stream_unary_rpc_method_handler
    return make(behavior, request_deserializer=parse, response_serializer=serialize)


def _parser(request_type: Any) -> Callable[[bytes], Any]:
    name = request_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return request_type.FromString(data)
        except DecodeError as exc:
            return Undecodable(name, str(exc).rpartition(": ")[2] or "it does not parse")

    return parse


def _checked_unary(behavior: Callable[..., Any], streams_out: bool) -> Callable[..., Any]:
    if streams_out:

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request.error()))
            async for reply in behavior(request, context):
                yield reply

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request.error()))
        return await behavior(request, context)

    return unary


def _checked_stream(behavior: Callable[..., Any], streams_out: bool) -> Callable[..., Any]:
    """A method taking a stream, given the stream's messages checked one by one: an undecodable
    one fails the read, which the method's guard answers INVALID_ARGUMENT."""

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                raise request.error()
            yield request

    if streams_out:

        async def stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for reply in behavior(checked(requests), context):  # an async generator, as gRPC tells them
                yield reply

        return stream

    async def unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(checked(requests), context)

    return unary
