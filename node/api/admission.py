"""Who gets in, and what they may hold, before a request is read: the gate in front of every
gRPC listener of a node.

grpcio reads and parses a unary request in full (up to ``max_request_bytes``) before a handler
runs, so a token checked in the handler is checked too late: anonymous callers could make a
node hold gigabytes, and calls whose requests never finish sending held its call slots. The
`Gate` wraps every handler of a listener (its own services, health and reflection alike) so
that, in this order:

1. the caller is authenticated from the call's metadata and TLS session alone (no byte of the
   request is read; a stranger is answered ``UNAUTHENTICATED`` and costs nothing more);
2. the call is admitted: at most ``max_concurrent_rpcs`` authenticated calls and streams at
   once on the node, and at most ``max_principal_rpcs`` of them per principal, so no tenant
   can take the slots the others need (``RESOURCE_EXHAUSTED`` naming the limit);
3. a unary request is read only once ``max_request_bytes`` of the node's request memory
   (``max_request_memory_bytes``; a principal at most ``max_principal_request_memory_bytes``)
   is reserved for it, and only for ``request_read_timeout_ms`` (then ``DEADLINE_EXCEEDED``);
   once read, the reservation shrinks to its size and is held until the call is answered.
   When requests already read fill the budget, new calls are refused at once; when reads in
   progress do, a call waits for one of them (they finish or time out).

Requests on a stream are read one at a time by its handler, each counted from its read until
the next one; a handler that keeps requests longer counts them itself (`keep_request`,
`release_request`: `ScheduleStream` keeps the requests it has proposed and not yet answered,
at most ``max_request_bytes`` of them).

The authenticated principal is handed to the handler in `CALLER`. Members calling the peer
listener and every caller of a node run ``insecure_grpc`` (`ANYONE`) count towards the node's
limits only. Thread contract: everything runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Never, Protocol

import grpc

from tickwheel.common.errors import InvariantViolation, Overloaded, Unauthenticated, invariant
from tickwheel.node.security.access import ANYONE, Principal
from tickwheel.node.security.identity import CallMetadata

MEMBERS = Principal("%members%", ())
"""The callers of the peer listener's own services (members, proven by the peer token)."""

CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar("tickwheel_caller")
"""The principal the gate authenticated, for the handler of the call."""

Authenticate = Callable[[CallMetadata], Principal]
"""Who calls, from the metadata and the TLS session; raises `Unauthenticated`."""


class CallContext(CallMetadata, Protocol):
    """What the gate and the services use of a call's context: any
    `grpc.aio.ServicerContext`, whatever its request and response types."""

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Sequence[tuple[str, str | bytes]] = ()) -> Never: ...

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str | bytes]]
                              ) -> None: ...

    def time_remaining(self) -> float | None:
        """None when the call has no deadline (grpc-stubs says float)."""

    def peer(self) -> str: ...


class _AioHandler(Protocol):
    """A method's handler as grpc.aio serves it (grpc-stubs types the sync server's, whose
    behaviours return and iterate plainly). The gate serves every method of every service: a
    request is whatever the method's own deserializer makes of bytes, hence `Any`."""

    request_streaming: bool
    request_deserializer: Callable[[bytes], object] | None
    response_serializer: Callable[[Any], bytes] | None
    unary_unary: Callable[[Any, CallContext], Awaitable[object]] | None
    unary_stream: Callable[[Any, CallContext], AsyncIterator[object]] | None
    stream_unary: Callable[[AsyncIterator[Any], CallContext], Awaitable[object]] | None
    stream_stream: Callable[[AsyncIterator[Any], CallContext], AsyncIterator[object]] | None


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What a node's callers may hold at once (docs/security.md lists them)."""

    max_concurrent_rpcs: int = 1_024
    """Authenticated calls and streams on the node at once, over every listener."""
    max_principal_rpcs: int = 256
    """Calls and streams of one principal at once (forwarded ones counted as theirs)."""
    max_request_bytes: int = 8 << 20
    """The largest request message a node reads (`tickwheel.node.api.validation.Limits`)."""
    max_request_memory_bytes: int = 256 << 20
    """Request bytes the node holds at once: reserved while being read, then held until
    answered."""
    max_principal_request_memory_bytes: int = 64 << 20
    """The same, for one principal."""
    request_read_timeout_ms: int = 10_000
    """How long a unary request may take to arrive once its call is admitted."""


class Admission:
    """The node's counts of calls and request bytes, per principal and in all."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self._calls: Counter[str] = Counter()
        self._calls_total = 0
        self._bytes: Counter[str] = Counter()
        self._bytes_total = 0
        self._reading: Counter[str] = Counter()
        """Reservations of reads in progress, per principal, in bytes."""
        self._reading_total = 0
        self._waiters: list[asyncio.Future[None]] = []

    def enter(self, principal: Principal) -> None:
        """Count a new call of ``principal``; `Overloaded` if a limit is reached."""
        if self._calls_total >= self.limits.max_concurrent_rpcs:
            raise Overloaded("max_concurrent_rpcs (calls and streams on this node)")
        if _shared(principal) and self._calls[principal.name] >= self.limits.max_principal_rpcs:
            raise Overloaded(f"max_principal_rpcs (calls and streams of principal "
                             f"{principal.name!r})")
        self._calls[principal.name] += 1
        self._calls_total += 1

    def leave(self, principal: Principal) -> None:
        self._calls[principal.name] -= 1
        if not self._calls[principal.name]:
            del self._calls[principal.name]
        self._calls_total -= 1

    async def reserve(self, principal: Principal) -> None:
        """Reserve ``max_request_bytes`` for a request about to be read: `Overloaded` at once
        if requests already read leave no room, else wait for reads in progress to finish."""
        size = self.limits.max_request_bytes
        while not self._room(principal, size, self._reading_total, self._reading[principal.name]):
            if not self._room(principal, size, 0, 0):
                what = ("max_request_memory_bytes (request bytes this node holds)"
                        if self._bytes_total + size > self.limits.max_request_memory_bytes
                        else f"max_principal_request_memory_bytes (request bytes of principal "
                             f"{principal.name!r})")
                raise Overloaded(what)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        self._reading[principal.name] += size
        self._reading_total += size

    def read(self, principal: Principal, size: int) -> None:
        """The reserved read is over: ``size`` bytes arrived (0: none) and are now held."""
        self._reading[principal.name] -= self.limits.max_request_bytes
        if not self._reading[principal.name]:
            del self._reading[principal.name]
        self._reading_total -= self.limits.max_request_bytes
        self.hold(principal, size)
        self._wake()

    def hold(self, principal: Principal, size: int) -> None:
        self._bytes[principal.name] += size
        self._bytes_total += size

    def release(self, principal: Principal, size: int) -> None:
        """``size`` bytes of ``principal``'s requests are answered and dropped."""
        invariant(0 <= size <= self._bytes[principal.name], "released more than was held")
        self._bytes[principal.name] -= size
        if not self._bytes[principal.name]:
            del self._bytes[principal.name]
        self._bytes_total -= size
        self._wake()

    def held_bytes(self) -> int:
        """Request bytes held and reserved on the node now."""
        return self._bytes_total + self._reading_total

    def _room(self, principal: Principal, size: int, reading_total: int,
              reading_own: int) -> bool:
        limits = self.limits
        if self._bytes_total + reading_total + size > limits.max_request_memory_bytes:
            return False
        return not _shared(principal) or (self._bytes[principal.name] + reading_own + size
                                          <= limits.max_principal_request_memory_bytes)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def _shared(principal: Principal) -> bool:
    """Whether ``principal`` is held to a tenant's share (members and `ANYONE` are not)."""
    return principal is not MEMBERS and principal is not ANYONE


class _Call:
    """One admitted call: what it holds, released when it ends."""

    def __init__(self, admission: Admission, principal: Principal) -> None:
        self.admission = admission
        self.principal = principal
        self.held = 0

    def hold(self, size: int) -> None:
        self.admission.hold(self.principal, size)
        self.held += size

    def release(self, size: int) -> None:
        size = min(size, self.held)
        self.admission.release(self.principal, size)
        self.held -= size


CALL: contextvars.ContextVar[_Call] = contextvars.ContextVar("tickwheel_call")
"""The admitted call being served: a stream handler releases the requests it keeps with it."""


def keep_request(size: int) -> None:
    """A stream handler keeps a request of ``size`` bytes past the next read: count it until
    `release_request`. A no-op outside a gated call."""
    call = CALL.get(None)
    if call is not None:
        call.hold(size)


def release_request(size: int) -> None:
    """A stream handler is done with a request it kept (`keep_request`)."""
    call = CALL.get(None)
    if call is not None:
        call.release(size)


class Gate(grpc.aio.ServerInterceptor):
    """Authenticates and admits every call of a listener before its request is read (see the
    module docstring). ``refused`` is told the status code of every call refused here."""

    def __init__(self, admission: Admission, authenticate: Authenticate,
                 refused: Callable[[grpc.StatusCode], None]) -> None:
        self._admission = admission
        self._authenticate = authenticate
        self._refused = refused
        self._gated: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        """Per method served: its handler behind the gate (made once), of any messages."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        gated = self._gated.get(details.method)
        if gated is not None:
            return gated
        handler = await continuation(details)
        if handler is None:  # no such method: grpcio answers UNIMPLEMENTED, nothing is kept
            return None
        served = _aio(handler)
        gated = self._streaming(served) if served.request_streaming else self._unary(served)
        self._gated[details.method] = gated
        return gated

    def _unary(self, handler: _AioHandler) -> grpc.RpcMethodHandler[Any, Any]:
        """Served as a request-streaming method, so that the request is read here, after the
        gate, and not by grpcio before any code of ours runs."""
        decode = handler.request_deserializer or (lambda data: data)
        if handler.unary_unary is not None:
            behaviour = handler.unary_unary

            async def unary_unary(requests: AsyncIterator[bytes],
                                  context: CallContext) -> object:
                async with self._admitted(context) as call:
                    request = await self._read(requests, context, call, decode)
                    return await behaviour(request, context)
            return grpc.stream_unary_rpc_method_handler(
                unary_unary, response_serializer=handler.response_serializer)
        responses = handler.unary_stream
        if responses is None:
            raise InvariantViolation("a unary method serves a response or a stream of them")

        async def unary_stream(requests: AsyncIterator[bytes],
                               context: CallContext) -> AsyncIterator[object]:
            async with self._admitted(context) as call:
                request = await self._read(requests, context, call, decode)
                async for response in responses(request, context):
                    yield response
        return grpc.stream_stream_rpc_method_handler(
            unary_stream, response_serializer=handler.response_serializer)

    def _streaming(self, handler: _AioHandler) -> grpc.RpcMethodHandler[Any, Any]:
        decode = handler.request_deserializer or (lambda data: data)
        if handler.stream_unary is not None:
            behaviour = handler.stream_unary

            async def stream_unary(requests: AsyncIterator[bytes],
                                   context: CallContext) -> object:
                async with self._admitted(context) as call:
                    return await behaviour(_counted(requests, call, decode), context)
            return grpc.stream_unary_rpc_method_handler(
                stream_unary, response_serializer=handler.response_serializer)
        streams = handler.stream_stream
        if streams is None:
            raise InvariantViolation("a request-streaming method serves a response or a stream")

        async def stream_stream(requests: AsyncIterator[bytes],
                                context: CallContext) -> AsyncIterator[object]:
            async with self._admitted(context) as call:
                async for response in streams(_counted(requests, call, decode), context):
                    yield response
        return grpc.stream_stream_rpc_method_handler(
            stream_stream, response_serializer=handler.response_serializer)

    def _admitted(self, context: CallContext) -> _Admitted:
        return _Admitted(self, context)

    async def _read(self, requests: AsyncIterator[bytes], context: CallContext,
                    call: _Call, decode: Callable[[bytes], object]) -> object:
        admission = self._admission
        timeout_ms = admission.limits.request_read_timeout_ms
        data = None
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await admission.reserve(call.principal)
                received = aiter(requests)
                try:
                    data = await anext(received, b"")
                finally:
                    admission.read(call.principal, 0)
                    if isinstance(received, AsyncGenerator):
                        # grpc.aio's receiver, an async generator: left suspended after its one
                        # request, it was closed by the event loop's finalizer once the call
                        # was dropped, a task and a wake of the loop for every unary call
                        await received.aclose()
        except Overloaded as error:
            await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        except TimeoutError:
            await self._refuse(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"the request did not arrive within request_read_timeout_ms "
                               f"({timeout_ms} ms)")
        invariant(data is not None, "a request was read or the call refused")
        call.hold(len(data))
        try:
            return decode(data)
        except Exception as error:  # whatever a generated parser raises
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"request: could not be decoded: {error}")

    async def _refuse(self, context: CallContext, code: grpc.StatusCode,
                      details: str) -> Never:
        self._refused(code)
        await context.abort(code, details)


class _Admitted:
    """``async with``: authenticate and admit a call, publish its principal, release what
    it holds at the end."""

    def __init__(self, gate: Gate, context: CallContext) -> None:
        self._gate = gate
        self._context = context
        self._call: _Call | None = None
        self._tokens: tuple[contextvars.Token[Principal], contextvars.Token[_Call]] | None = None

    async def __aenter__(self) -> _Call:
        gate, context = self._gate, self._context
        try:
            principal = gate._authenticate(context)
        except Unauthenticated as error:
            await gate._refuse(context, grpc.StatusCode.UNAUTHENTICATED, str(error))
        try:
            gate._admission.enter(principal)
        except Overloaded as error:
            await gate._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        self._call = _Call(gate._admission, principal)
        self._tokens = (CALLER.set(principal), CALL.set(self._call))
        return self._call

    async def __aexit__(self, *exc_info: object) -> None:
        call, tokens = self._call, self._tokens
        if call is None or tokens is None:
            raise InvariantViolation("entered before exit")
        call.release(call.held)
        call.admission.leave(call.principal)
        # A stream's handler (an async generator) that its caller left unfinished is closed by
        # the event loop's finalizer, in a context of its own: nothing of this call is set
        # there, and resetting would raise.
        with contextlib.suppress(ValueError):
            CALL.reset(tokens[1])
            CALLER.reset(tokens[0])


async def _counted(requests: AsyncIterator[bytes], call: _Call,
                   decode: Callable[[bytes], object]) -> AsyncIterator[object]:
    """The requests of a stream, each counted from its read until the next is read."""
    last = 0
    async for data in requests:
        call.release(last)
        call.hold(len(data))
        last = len(data)
        yield decode(data)


def _aio(handler: grpc.RpcMethodHandler[Any, Any]) -> _AioHandler:
    """``handler`` as grpc.aio serves it (`_AioHandler` says why the stubs' type is not)."""
    return handler  # type: ignore[return-value]  # grpc-stubs types the sync server's handlers
