"""The gate's bookkeeping for a stream its caller left unfinished (in process: the event
loop's async generator finalizer is what closes it on a node), and a unary call's request
stream, which the gate closes itself."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tickwheel.node.api.admission import Admission, AdmissionLimits, Gate
from tickwheel.node.security.access import ANYONE


class Context:
    """What the gate asks of a call's context."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"refused: {code} {details}")


class Details:
    method = "/tickwheel.v1.Tickwheel/Receive"
    invocation_metadata = ()


async def responses(requests: AsyncIterator[object], context: object) -> AsyncIterator[bytes]:
    while True:
        yield b"batch"


def test_a_stream_closed_from_another_context_leaves_its_slot_and_raises_nothing() -> None:
    # Before: the gate reset its context variables with tokens of the handler's context, and
    # the finalizer's close raised ValueError ("created in a different Context"), logged by
    # the node's loop as "Task exception was never retrieved".
    async def run() -> None:
        admission = Admission(AdmissionLimits(max_concurrent_rpcs=1))
        gate = Gate(admission, lambda context: ANYONE, lambda code: None)

        async def continuation(details: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.stream_stream_rpc_method_handler(responses)
        handler: Any = await gate.intercept_service(continuation, Details())

        async def requests() -> AsyncIterator[bytes]:
            await asyncio.Event().wait()
            yield b""
        stream = handler.stream_stream(requests(), Context())
        assert await anext(stream) == b"batch"
        await asyncio.create_task(stream.aclose(), context=contextvars.Context())
        again = handler.stream_stream(requests(), Context())  # the one slot was given back
        assert await anext(again) == b"batch"
        await again.aclose()
    asyncio.run(run())


class UnaryDetails:
    method = "/tickwheel.v1.Tickwheel/Schedule"
    invocation_metadata = ()


def test_a_unary_call_closes_its_request_stream_once_its_request_is_read() -> None:
    # Before: the gate read the one request and left the stream (grpc.aio's receiver, an async
    # generator) suspended after it; the event loop's finalizer closed it once the call was
    # dropped, in a task of its own, for every unary call.
    async def run() -> None:
        gate = Gate(Admission(AdmissionLimits()), lambda context: ANYONE, lambda code: None)

        async def echo(request: bytes, context: object) -> bytes:
            return request

        async def continuation(details: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(echo)
        handler: Any = await gate.intercept_service(continuation, UnaryDetails())

        async def requests() -> AsyncIterator[bytes]:
            yield b"request"
        received = requests()
        assert await handler.stream_unary(received, Context()) == b"request"
        assert received.ag_frame is None, "the request stream is left for the finalizer"
    asyncio.run(run())
