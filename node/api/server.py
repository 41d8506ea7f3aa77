"""The gRPC face of a node (grpc.aio): `TickwheelService`, served to authenticated callers on
the client listener and to members (the calls followers forward) on the peer listener
(`tickwheel.node.listeners` assembles them). Every call reaches it through the listener's gate
(`tickwheel.node.api.admission`), which authenticated and admitted it before its request was read
(`tickwheel.node.security.identity` says who calls); here it is authorized as that principal
(`tickwheel.node.security.access`) before anything is done: what
each unary call does on the leader is `tickwheel.node.api.calls`; consumer streams are here.

Errors map to status codes in one table (`_STATUS`); a request that does not decode is one
of them (`InvalidMessage` naming ``request``). A follower forwards client calls to the
leader's peer listener (`tickwheel.node.api.forward`); every answer carries the leader's gRPC
address in the ``tickwheel-leader`` trailer, so clients can go there directly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Never, TypeVar

import grpc
from google.protobuf.message import Message

from tickwheel.common.errors import (
    ClientError,
    ConsumerNotAcking,
    InvalidMessage,
    InvariantViolation,
    MapConflict,
    NotLeader,
    Overloaded,
    PermissionDenied,
    QuotaExceeded,
    Retryable,
    TickwheelError,
    Unauthenticated,
    VersionConflict,
    WrongShard,
    invariant,
)
from tickwheel.common.status_details import STATUS_DETAILS_KEY, quota_details
from tickwheel.node.api import validation
from tickwheel.node.api.admission import CALLER, CallContext, keep_request, release_request
from tickwheel.node.api.calls import LeaderCalls, answer_of, receive_response, require
from tickwheel.node.api.commits import WRITE_TIMEOUT_S
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.forward import (
    LEADER_KEY,
    LeaderRefused,
    forwarded,
    status_details,
    was_forwarded,
)
from tickwheel.node.api.info import cluster_info, describe, due_histogram
from tickwheel.node.api.shard_peers import ShardPeers
from tickwheel.node.delivery.sessions import Session
from tickwheel.node.security.access import Action, Principal
from tickwheel.node.security.quotas import Reservation
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

_STATUS: list[tuple[type[TickwheelError], grpc.StatusCode]] = [
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (WrongShard, grpc.StatusCode.FAILED_PRECONDITION),
    (MapConflict, grpc.StatusCode.FAILED_PRECONDITION),
    (ConsumerNotAcking, grpc.StatusCode.FAILED_PRECONDITION),
    (VersionConflict, grpc.StatusCode.FAILED_PRECONDITION),
    (ClientError, grpc.StatusCode.INVALID_ARGUMENT),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Retryable, grpc.StatusCode.UNAVAILABLE),
    (TickwheelError, grpc.StatusCode.INTERNAL),
]
STREAM_WINDOW = 64
"""`ScheduleStream` requests proposed and not yet answered, per stream."""
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Tickwheel"].full_name
RequestT = TypeVar("RequestT", bound=Message)
ResponseT = TypeVar("ResponseT", bound=Message)
_Context = grpc.aio.ServicerContext
"""A servicer method's context, by its request and response types."""


class _EndOfStream(Exception):
    """The consumer closed its side of a `Receive` stream."""


class TickwheelService(pb_grpc.TickwheelServicer):
    """Served to applications (the client listener) and to members forwarding for them (the
    peer listener), behind each listener's gate (`tickwheel.node.api.admission.CALLER` is who
    calls)."""

    def __init__(self, node: NodeContext) -> None:
        self._node = node
        self.shard_peers = ShardPeers(lambda: node.shards, node.forwarder, node.peer_callers,
                                      partial(describe, node), node.members[node.replica.address])
        """The other shards' leaders and members (`tickwheel.node.api.shard_peers`)."""
        self._here = LeaderCalls(node, self.shard_peers).handlers()

    async def Schedule(self, request: pb.ScheduleRequest,
                       context: _Context[pb.ScheduleRequest, pb.ScheduleResponse]
                       ) -> pb.ScheduleResponse:
        return await self._unary(context, "Schedule", request, pb.ScheduleResponse)

    async def ScheduleStream(self, request_iterator: AsyncIterator[pb.ScheduleRequest],
                             context: _Context[pb.ScheduleRequest, pb.ScheduleResponse]
                             ) -> pb.ScheduleResponse:
        """Each request is proposed as it arrives, up to ``STREAM_WINDOW`` of them (and at most
        ``max_request_bytes`` of them) uncommitted, so small requests on one stream share Raft
        entries as concurrent calls do; the answer lists every result in request order. An
        error fails the stream; what was committed before it stays (a retry with the same ids
        returns those results)."""
        limits = self._node.limits
        pending: deque[tuple[asyncio.Future[pb.ScheduleResponse], int]] = deque()
        pending_bytes = 0
        results: list[pb.ScheduleResult] = []
        streamed = 0
        principal = await self._principal(context)
        try:
            async for request in request_iterator:
                streamed += len(request.messages)
                if streamed > limits.max_stream_msgs:
                    await self._abort(context, InvalidMessage(
                        "messages", f"a stream carries at most {limits.max_stream_msgs} "
                        "messages; open another"))
                size = request.ByteSize()
                keep_request(size)
                pending_bytes += size
                pending.append((asyncio.ensure_future(self._unary(
                    context, "Schedule", request, pb.ScheduleResponse, principal)), size))
                while pending and (len(pending) > STREAM_WINDOW or pending[0][0].done()
                                   or pending_bytes > limits.max_request_bytes):
                    future, size = pending.popleft()
                    results.extend((await future).results)
                    release_request(size)
                    pending_bytes -= size
            while pending:
                results.extend((await pending.popleft()[0]).results)
        except TickwheelError as error:  # a request that does not decode
            await self._abort(context, error)
        finally:
            for future, _ in pending:
                future.cancel()
        return pb.ScheduleResponse(results=results)

    async def Cancel(self, request: pb.CancelRequest,
                     context: _Context[pb.CancelRequest, pb.CancelResponse]) -> pb.CancelResponse:
        return await self._unary(context, "Cancel", request, pb.CancelResponse)

    async def Reschedule(self, request: pb.RescheduleRequest,
                         context: _Context[pb.RescheduleRequest, pb.RescheduleResponse]
                         ) -> pb.RescheduleResponse:
        return await self._unary(context, "Reschedule", request, pb.RescheduleResponse)

    async def GrowShards(self, request: pb.GrowShardsRequest,
                         context: _Context[pb.GrowShardsRequest, pb.GrowShardsResponse]
                         ) -> pb.GrowShardsResponse:
        return await self._unary(context, "GrowShards", request, pb.GrowShardsResponse)

    async def FinalizeUpgrade(self, request: pb.FinalizeUpgradeRequest, context: _Context[
            pb.FinalizeUpgradeRequest, pb.FinalizeUpgradeResponse]) -> pb.FinalizeUpgradeResponse:
        return await self._unary(context, "FinalizeUpgrade", request, pb.FinalizeUpgradeResponse)

    async def ClusterInfo(self, request: pb.ClusterInfoRequest, context: _Context[
            pb.ClusterInfoRequest, pb.ClusterInfoResponse]) -> pb.ClusterInfoResponse:
        info = cluster_info(self._node, await self._principal(context))
        context.set_trailing_metadata(((LEADER_KEY, info.leader_grpc),))
        return info

    async def DueHistogram(self, request: pb.DueHistogramRequest, context: _Context[
            pb.DueHistogramRequest, pb.DueHistogramResponse]) -> pb.DueHistogramResponse:
        try:
            answer = due_histogram(self._node, request.span, await self._principal(context),
                                   request.topic)
        except TickwheelError as error:
            await self._abort(context, error)
        self._set_leader(context)
        return answer

    async def Receive(self, request_iterator: AsyncIterator[pb.ReceiveRequest],
                      context: _Context[pb.ReceiveRequest, pb.ReceiveResponse]
                      ) -> AsyncIterator[pb.ReceiveResponse]:
        node = self._node
        principal = await self._principal(context)
        try:
            first = await self._first_request(request_iterator)
            stream, consumer = await self._subscribe(first.subscribe, principal, context)
        except NotLeader as error:
            async for response in self._proxy_receive(first, request_iterator, context, error,
                                                      principal):
                yield response
            return
        except TickwheelError as error:
            await self._abort(context, error)
        reader = asyncio.create_task(self._read_consumer(request_iterator, consumer))
        try:
            while True:
                try:
                    consumer.writing = await consumer.next_batch()
                except _EndOfStream:
                    return
                except TickwheelError as error:
                    await self._abort(context, error)
                yield receive_response(consumer.writing, consumer.group,
                                        node.replica.address, node.replica.handle_cipher())
                consumer.written()  # gRPC asks for the next response once it wrote this one
        finally:
            reader.cancel()
            node.courier.unsubscribe(consumer)
            stream.release()

    async def _subscribe(self, subscribe: pb.Subscribe, principal: Principal,
                         context: CallContext) -> tuple[Reservation, Session]:
        """A consumer of the courier for ``subscribe``, and the stream it holds against its
        principal's ``max_consumer_streams`` here; `NotLeader` on a follower (which passes
        the stream to the leader: that counts it)."""
        node = self._node
        timeout_ms = validation.check_subscribe(
            subscribe, node.limits, node.courier.config.default_visibility_timeout_ms)
        require(principal, Action.CONSUME, subscribe.topic, "subscribe.topic", subscribe.group)
        stream = node.quotas.open_stream(principal)
        try:
            consumer = await node.courier.subscribe(subscribe.topic, subscribe.group,
                                                    subscribe.consumer or context.peer(),
                                                    subscribe.credits, timeout_ms,
                                                    hold=subscribe.hold)
        except BaseException:
            stream.release()
            raise
        return stream, consumer

    async def _first_request(self, request_iterator: AsyncIterator[pb.ReceiveRequest]
                             ) -> pb.ReceiveRequest:
        """A stream's subscription, which must come first, within ``request_read_timeout_ms``:
        a stream that never subscribes would hold one of its principal's slots for nothing."""
        timeout_ms = self._node.admission.limits.request_read_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                first = await anext(aiter(request_iterator), None)
        except TimeoutError:
            raise InvalidMessage("subscribe", "a stream must subscribe within "
                                 f"request_read_timeout_ms ({timeout_ms} ms)") from None
        if first is None or first.WhichOneof("kind") != "subscribe":
            raise InvalidMessage("subscribe", "the first request of a stream must subscribe")
        return first

    async def ReceiveMessages(self, request: pb.ReceiveMessagesRequest,
                              context: _Context[pb.ReceiveMessagesRequest, pb.ReceiveResponse]
                              ) -> pb.ReceiveResponse:
        return await self._unary(context, "ReceiveMessages", request, pb.ReceiveResponse)

    async def AckMessages(self, request: pb.SettleRequest,
                          context: _Context[pb.SettleRequest, pb.SettleResponse]
                          ) -> pb.SettleResponse:
        return await self._unary(context, "AckMessages", request, pb.SettleResponse)

    async def ChangeInvisibleDuration(self, request: pb.SettleRequest,
                                      context: _Context[pb.SettleRequest, pb.SettleResponse]
                                      ) -> pb.SettleResponse:
        return await self._unary(context, "ChangeInvisibleDuration", request, pb.SettleResponse)

    async def CreateGroup(self, request: pb.GroupRequest,
                          context: _Context[pb.GroupRequest, pb.GroupResponse]) -> pb.GroupResponse:
        return await self._unary(context, "CreateGroup", request, pb.GroupResponse)

    async def DeleteGroup(self, request: pb.GroupRequest,
                          context: _Context[pb.GroupRequest, pb.GroupResponse]) -> pb.GroupResponse:
        return await self._unary(context, "DeleteGroup", request, pb.GroupResponse)

    async def perform(self, context: CallContext | None, method: str,
                      request: Message, principal: Principal) -> Message:
        """Answer unary ``method`` (``"Schedule"``, ``"ReceiveMessages"``, ...) as ``principal``:
        here if this node leads, else forwarded once to the leader (within the deadline of the
        call ``context`` serves, if any). Raises the refusal, as a `TickwheelError`, or
        `LeaderRefused` with the status the leader answered. The RocketMQ listener serves
        through it too."""
        try:
            return await self._here[method](request, principal)
        except NotLeader as error:
            return await self._forward(context, method, request, error, principal)

    async def _unary(self, context: CallContext, method: str, request: Message,
                     answer: type[ResponseT], principal: Principal | None = None) -> ResponseT:
        """`perform` for the caller's principal, which answers ``method`` with an ``answer``;
        errors become status codes."""
        if principal is None:
            principal = await self._principal(context)
        try:
            response = answer_of(method, await self.perform(context, method, request, principal),
                                 answer)
        except LeaderRefused as refused:
            await context.abort(refused.code, refused.details,
                                (*self._leader_trailer(), *refused.trailers))
        except TickwheelError as error:
            self._set_leader(context)  # a member of another shard finds the leader by it
            await self._abort(context, error)
        self._set_leader(context)
        return response

    async def _principal(self, context: CallContext) -> Principal:
        """Who calls, as the listener's gate authenticated it."""
        principal = CALLER.get(None)
        if principal is None:
            raise InvariantViolation("every call passes a listener's gate")
        return principal

    async def _forward(self, context: CallContext | None, method: str,
                       request: Message, error: NotLeader, principal: Principal) -> Message:
        leader = self._node.leader_peer(error.leader_hint)
        if leader is None or (context is not None and was_forwarded(context)):
            raise Retryable(f"no leader reachable from here yet ({error}); retry")
        call = getattr(self._node.forwarder.stub(leader), method)(
            request, metadata=forwarded(self._node.peer_callers, principal),
            timeout=(context and context.time_remaining()) or WRITE_TIMEOUT_S)
        try:
            response: Message = await call
        except grpc.aio.AioRpcError as failed:
            raise LeaderRefused.of(failed) from None
        return response

    # -- consumers --------------------------------------------------------------------------

    async def _read_consumer(self, request_iterator: AsyncIterator[pb.ReceiveRequest],
                             consumer: Session) -> None:
        """Credits, acks and nacks from the consumer, until it closes its side."""
        courier, limits = self._node.courier, self._node.limits
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "credit":
                    validation.check_credits(request.credit.credits,
                                             consumer.credits + len(consumer.unacked), limits)
                    courier.grant(consumer, request.credit.credits)
                elif kind == "ack":
                    courier.acknowledge(consumer, list(request.ack.receipts))
                elif kind == "nack":
                    courier.nack(consumer, list(request.nack.receipts))
                else:
                    raise InvalidMessage("subscribe", "a stream subscribes once, first")
            consumer.close(_EndOfStream())
        except (TickwheelError, grpc.RpcError) as error:
            consumer.close(error if isinstance(error, TickwheelError) else _EndOfStream())

    async def _proxy_receive(self, first: pb.ReceiveRequest,
                             request_iterator: AsyncIterator[pb.ReceiveRequest],
                             context: CallContext, error: NotLeader,
                             principal: Principal) -> AsyncIterator[pb.ReceiveResponse]:
        """A follower passes a consumer stream through to the leader, both ways."""
        leader = self._node.leader_peer(error.leader_hint)
        if leader is None or was_forwarded(context):
            await self._abort(context, Retryable(
                f"no leader reachable from here yet ({error}); retry"))
        forwarder = self._node.forwarder
        call = forwarder.stub(leader).Receive(
            metadata=forwarded(self._node.peer_callers, principal))
        refused: list[TickwheelError] = []

        async def upstream() -> None:
            """A request that does not decode closes our side: the leader then ends the
            stream, and this one ends with the refusal."""
            try:
                await call.write(first)
                async for request in request_iterator:
                    await call.write(request)
            except TickwheelError as undecodable:
                refused.append(undecodable)
            await call.done_writing()
        pump = asyncio.create_task(upstream())
        with forwarder.passing(leader, call) as passage:
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as failed:
                await context.abort(failed.code(), failed.details() or "",
                                    (*self._leader_trailer(), *status_details(failed)))
            except asyncio.CancelledError:
                if not passage.moved:
                    raise
                await self._abort(context, Retryable(
                    f"this node no longer follows {leader}; retry"))
            finally:
                pump.cancel()
                call.cancel()
        if refused:
            await self._abort(context, refused[0])

    # -- helpers ----------------------------------------------------------------------------

    def _decoding(self, method: Callable[[RequestT, CallContext], Awaitable[object]],
                 decode: Callable[[bytes], RequestT]
                 ) -> Callable[[bytes, CallContext], Awaitable[object]]:
        """A unary ``method`` that takes the request's bytes: grpcio decodes a unary request
        before any handler runs, where nothing raised can become a status code."""
        async def handle(data: bytes, context: CallContext) -> object:
            try:
                request = decode(data)
            except TickwheelError as error:
                await self._abort(context, error)
            return await method(request, context)
        return handle

    def _set_leader(self, context: CallContext) -> None:
        """The leader's gRPC address in the trailers, "" if unknown: a client tells by it that
        the node answered (a refusal, not a broken connection) and need not be passed over."""
        context.set_trailing_metadata(self._leader_trailer())

    def _leader_trailer(self) -> tuple[tuple[str, str], ...]:
        leader = self._node.leader_grpc(self._node.replica.leader_hint())
        return ((LEADER_KEY, leader or ""),)

    async def _abort(self, context: CallContext, error: TickwheelError) -> Never:
        """Answer ``error``'s status code (`_STATUS`); a refusal over a quota carries its
        ``RetryInfo`` and ``QuotaFailure`` (`tickwheel.common.status_details`)."""
        code = next(code for kind, code in _STATUS if isinstance(error, kind))
        self._node.metrics.rejected.labels(code.name).inc()
        trailers: tuple[tuple[str, str | bytes], ...] = self._leader_trailer()
        if isinstance(error, QuotaExceeded):
            trailers += ((STATUS_DETAILS_KEY, quota_details(
                str(error), error.principal, error.quota, error.quota_value,
                error.retry_after_ms)),)
        await context.abort(code, str(error), trailers)


def add_tickwheel_service(service: TickwheelService, server: grpc.aio.Server) -> None:
    """The generated ``add_TickwheelServicer_to_server``, except that a request that does not
    decode answers INVALID_ARGUMENT: grpcio answers UNKNOWN for whatever a deserializer raises
    (and logs a traceback each time, for any client to repeat). A unary request is decoded in
    its handler (`TickwheelService._decoding`); a streamed one is decoded as the handler reads
    it, which then maps the `InvalidMessage` to a status code like any other refusal. The
    handlers are built from the service's descriptor, so every RPC of the proto is covered."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Tickwheel"].methods:
        handler = getattr(service, method.name)
        decode = validation.decoder(getattr(pb, method.input_type.name))
        encode = getattr(pb, method.output_type.name).SerializeToString
        if method.client_streaming:
            make = (grpc.stream_stream_rpc_method_handler if method.server_streaming
                    else grpc.stream_unary_rpc_method_handler)
            handlers[method.name] = make(handler, request_deserializer=decode,
                                         response_serializer=encode)
        else:
            invariant(not method.server_streaming, f"{method.name}: unary-stream RPCs are "
                      "not served")
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                service._decoding(handler, decode), response_serializer=encode)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
