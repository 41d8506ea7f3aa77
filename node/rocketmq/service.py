"""`MessagingService`: RocketMQ 5's client protocol, served from tickwheel's own calls.

Every call is authenticated by its signature (`tickwheel.node.rocketmq.signature`), turned into
the native request (`tickwheel.node.rocketmq.convert`) and answered through
`TickwheelService.perform` (`tickwheel.node.rocketmq.calls`) as the signer's principal: here on
the leader, forwarded by a follower, with the same checks, limits and grants as the native API.
So any node serves any call, and in a cluster of one shard the route names one address for
all of them: the one the client asked with (a Kubernetes Service, a list of nodes), or
``rocketmq_advertise``.

In a cluster of several shards the route has a queue per shard, each at its shard's leader
(`tickwheel.node.api.shard_peers` asks the members), so consumers receive from every shard; a
message sent to any queue goes to the shard its id belongs to, so a producer's retry through
another queue is still one message.

Every answer carries a RocketMQ status (refusals too: the clients read the status, not gRPC's
code); a request that does not decode answers ``BAD_REQUEST``. What tickwheel does not serve
(pull and offsets, transactions, FIFO dead-lettering, lite topics) answers ``UNSUPPORTED``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TypeVar

from google.protobuf.message import Message

from tickwheel.client.shards import handle_shard, shard_of
from tickwheel.common.errors import InvariantViolation
from tickwheel.node.api.admission import CALLER
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.server import TickwheelService
from tickwheel.node.delivery.levels import RetryPolicy
from tickwheel.node.rocketmq import convert
from tickwheel.node.rocketmq.binding import Context, decode
from tickwheel.node.rocketmq.calls import (
    CLIENT_ID_KEY,
    DEFAULT_LONG_POLL_MS,
    NativeCalls,
    client_id_of,
)
from tickwheel.node.rocketmq.convert import OK, Refusal
from tickwheel.node.security.access import Principal
from tickwheel.node.security.identity import metadata_value
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.rocketmq.v2 import service_pb2 as svc
from tickwheel.v1 import tickwheel_pb2 as pb

log = logging.getLogger("tickwheel.node.rocketmq")

BROKER_NAME = "tickwheel"
PRODUCER_ATTEMPTS = 8
"""Sends a producer tries (its own retries reuse the message id, so they are one message):
enough to ride out a leader election with the back-off below."""
PRODUCER_BACKOFF = rmq.ExponentialBackoff(initial=convert.ms_duration(100),
                                          max=convert.ms_duration(2_000), multiplier=2.0)
DEFAULT_BATCH = 32
ResponseT = TypeVar("ResponseT", bound=Message)


class MessagingService:
    """The servicer; `add_messaging_service` binds its methods."""

    def __init__(self, node: NodeContext, native: TickwheelService,
                 advertise: str | None) -> None:
        """``advertise``: ``HOST:PORT`` the route names; None: the address the client asked
        with."""
        self._node = node
        self._native = native
        self._advertise = _endpoints(advertise) if advertise else None
        self._calls = NativeCalls(node, native)

    # -- routes and clients -------------------------------------------------------------------

    async def QueryRoute(self, request: svc.QueryRouteRequest, context: Context
                         ) -> svc.QueryRouteResponse:
        principal = self._caller(context)
        topic = convert.check_resource(request.topic, "topic")
        if not principal.sees(topic):
            raise Refusal(rmq.Code.FORBIDDEN, f"principal {principal.name!r} has no grant on "
                                              f"topic {topic!r}")
        return svc.QueryRouteResponse(status=OK, message_queues=await self._queues(
            topic, request.endpoints))

    async def QueryAssignment(self, request: svc.QueryAssignmentRequest, context: Context
                              ) -> svc.QueryAssignmentResponse:
        self._caller(context)
        topic = convert.check_resource(request.topic, "topic")
        return svc.QueryAssignmentResponse(status=OK, assignments=[
            rmq.Assignment(message_queue=queue)
            for queue in await self._queues(topic, request.endpoints)])

    async def Heartbeat(self, request: svc.HeartbeatRequest, context: Context
                        ) -> svc.HeartbeatResponse:
        self._caller(context)
        return svc.HeartbeatResponse(status=OK)

    async def NotifyClientTermination(self, request: svc.NotifyClientTerminationRequest,
                                      context: Context) -> svc.NotifyClientTerminationResponse:
        self._caller(context)
        self._calls.renewals.forget(client_id_of(context))
        return svc.NotifyClientTerminationResponse(status=OK)

    async def Telemetry(self, request_iterator: AsyncIterator[bytes], context: Context
                        ) -> AsyncIterator[svc.TelemetryCommand]:
        """Echo each settings command with the server's part filled in; the clients wait for
        it before they start."""
        try:
            principal = self._caller(context)
        except Refusal as refusal:
            yield svc.TelemetryCommand(status=refusal.status())
            return
        async for data in request_iterator:
            try:
                command = decode(svc.TelemetryCommand, data)
                if command.HasField("settings"):
                    settings = await self._settings(command.settings, principal, context)
                    yield svc.TelemetryCommand(status=OK, settings=settings)
            except Refusal as refusal:
                yield svc.TelemetryCommand(status=refusal.status())

    # -- producing ------------------------------------------------------------------------------

    async def SendMessage(self, request: svc.SendMessageRequest, context: Context
                          ) -> svc.SendMessageResponse:
        principal = self._caller(context)
        if not request.messages:
            raise Refusal(rmq.Code.BAD_REQUEST, "messages: is empty")
        now_ms = self._node.clock.now_ms()
        max_delay_ms = self._node.limits.max_delay_ms
        messages = [convert.to_tickwheel(m, f"messages[{i}]", now_ms, max_delay_ms)
                    for i, m in enumerate(request.messages)]
        parts: dict[int, list[int]] = {}
        for index, message in enumerate(messages):
            parts.setdefault(shard_of(message.id, self._node.shards.count), []).append(index)
        results: list[pb.ScheduleResult] = [pb.ScheduleResult()] * len(messages)

        async def send(shard: int, indexes: list[int]) -> None:
            """Its shard's messages, to that shard's leader: a retry (the same message id)
            reaches the same shard whichever queue the client picked, and is one message."""
            response = await self._calls.perform_on(
                shard, context, "Schedule",
                pb.ScheduleRequest(messages=[messages[i] for i in indexes]), principal,
                pb.ScheduleResponse)
            for index, result in zip(indexes, response.results, strict=True):
                results[index] = result

        await asyncio.gather(*(send(shard, indexes) for shard, indexes in parts.items()))
        entries = [svc.SendResultEntry(status=OK, message_id=result.id,
                                       recall_handle=f"{result.handle}.{result.id}")
                   for result in results]
        return svc.SendMessageResponse(status=OK, entries=entries)

    async def RecallMessage(self, request: svc.RecallMessageRequest, context: Context
                            ) -> svc.RecallMessageResponse:
        """Cancel by recall handle (``<handle>.<message id>``): OK while the message was
        pending (or recalled before), ``NOT_FOUND`` once a consumer group had it."""
        principal = self._caller(context)
        convert.check_resource(request.topic, "topic")
        handle, _, message_id = request.recall_handle.partition(".")
        if not handle.lstrip("-").isdigit() or not message_id:
            raise Refusal(rmq.Code.BAD_REQUEST, "recall_handle: is not one this cluster gave "
                                                "out")
        response = await self._calls.perform_on(
            handle_shard(int(handle)), context, "Cancel",
            pb.CancelRequest(handles=[int(handle)]), principal, pb.CancelResponse)
        outcome = response.outcomes[0]
        if outcome in (pb.CANCEL_OUTCOME_CANCELLED, pb.CANCEL_OUTCOME_ALREADY_CANCELLED):
            return svc.RecallMessageResponse(status=OK, message_id=message_id)
        raise Refusal(rmq.Code.NOT_FOUND, f"message {message_id!r} is no longer pending: "
                      f"{pb.CancelOutcome.Name(outcome)}")

    # -- consuming ------------------------------------------------------------------------------

    async def ReceiveMessage(self, request: svc.ReceiveMessageRequest, context: Context
                             ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        """A status, the messages, and the time (RocketMQ's order). The long poll waits for
        messages that match the filter; those that do not are acknowledged for the group
        (it subscribed without them, as RocketMQ skips them)."""
        try:
            principal = self._caller(context)
            batch, invisible_ms = await self._calls.receive(request, principal, context)
        except Refusal as refusal:
            yield svc.ReceiveMessageResponse(status=refusal.status())
            return
        if not batch:
            yield svc.ReceiveMessageResponse(status=rmq.Status(
                code=rmq.Code.MESSAGE_NOT_FOUND, message="no message came due in time"))
            return
        yield svc.ReceiveMessageResponse(status=OK)
        store_host = self._node.replica.address
        for delivered in batch:
            yield svc.ReceiveMessageResponse(
                message=convert.to_rocketmq(delivered, invisible_ms, store_host))
        yield svc.ReceiveMessageResponse(
            delivery_timestamp=convert.ms_timestamp(self._node.clock.now_ms()))

    async def AckMessage(self, request: svc.AckMessageRequest, context: Context
                         ) -> svc.AckMessageResponse:
        principal = self._caller(context)
        topic = convert.check_resource(request.topic, "topic")
        group = convert.check_resource(request.group, "group")
        if not request.entries:
            raise Refusal(rmq.Code.BAD_REQUEST, "entries: is empty")
        receipts = [entry.receipt_handle for entry in request.entries]
        settled = await self._calls.settle(context, principal, topic, group, receipts, None)
        self._calls.renewals.drop(client_id_of(context), receipts)
        entries = [svc.AckMessageResultEntry(
            message_id=entry.message_id, receipt_handle=entry.receipt_handle,
            status=OK if ok else _invalid_receipt(f"entries[{index}]"))
            for index, (entry, ok) in enumerate(zip(request.entries, settled, strict=True))]
        codes = {entry.status.code for entry in entries}
        status = (entries[0].status if len(codes) == 1 else
                  rmq.Status(code=rmq.Code.MULTIPLE_RESULTS, message="per entry"))
        return svc.AckMessageResponse(status=status, entries=entries)

    async def ChangeInvisibleDuration(self, request: svc.ChangeInvisibleDurationRequest,
                                      context: Context) -> svc.ChangeInvisibleDurationResponse:
        """The message is ready again when the new duration has passed (a PushConsumer's
        retry back-off). The receipt handle stays the lease's."""
        principal = self._caller(context)
        topic = convert.check_resource(request.topic, "topic")
        group = convert.check_resource(request.group, "group")
        invisible_ms = self._calls.invisible_ms(request.invisible_duration, "invisible_duration",
                                          least_ms=0)
        [ok] = await self._calls.settle(context, principal, topic, group, [request.receipt_handle],
                                  invisible_ms)
        self._calls.renewals.drop(client_id_of(context), [request.receipt_handle])
        if not ok:
            return svc.ChangeInvisibleDurationResponse(status=_invalid_receipt("receipt_handle"))
        return svc.ChangeInvisibleDurationResponse(status=OK,
                                                   receipt_handle=request.receipt_handle)

    # -- not served -----------------------------------------------------------------------------

    async def ForwardMessageToDeadLetterQueue(self, request: Message, context: Context
                                              ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        return _unsupported(svc.ForwardMessageToDeadLetterQueueResponse, "FIFO consumption")

    async def EndTransaction(self, request: Message, context: Context
                             ) -> svc.EndTransactionResponse:
        return _unsupported(svc.EndTransactionResponse, "transactional messages")

    async def UpdateOffset(self, request: Message, context: Context
                           ) -> svc.UpdateOffsetResponse:
        return _unsupported(svc.UpdateOffsetResponse, "offsets")

    async def GetOffset(self, request: Message, context: Context) -> svc.GetOffsetResponse:
        return _unsupported(svc.GetOffsetResponse, "offsets")

    async def QueryOffset(self, request: Message, context: Context) -> svc.QueryOffsetResponse:
        return _unsupported(svc.QueryOffsetResponse, "offsets")

    async def SyncLiteSubscription(self, request: Message, context: Context
                                   ) -> svc.SyncLiteSubscriptionResponse:
        return _unsupported(svc.SyncLiteSubscriptionResponse, "lite topics")

    async def PullMessage(self, request: Message, context: Context
                          ) -> AsyncIterator[svc.PullMessageResponse]:
        yield _unsupported(svc.PullMessageResponse, "pull consumers (offsets)")

    # -- helpers --------------------------------------------------------------------------------

    def _caller(self, context: Context) -> Principal:
        """Who signed the call, as the listener's gate checked it (`CALLER`)."""
        principal = CALLER.get(None)
        if principal is None:
            raise InvariantViolation("every call passes the listener's gate")
        self._calls.renewals.seen(metadata_value(context, CLIENT_ID_KEY) or "")
        return principal

    async def _queues(self, topic: str, asked: rmq.Endpoints) -> list[rmq.MessageQueue]:
        """One queue in a cluster of one shard, at the address the client asked with (or
        ``rocketmq_advertise``); in a cluster of several, one on broker ``tickwheel-k`` for
        shard k, at its leader (a shard no member of which answered is left out until one
        does)."""
        peers = self._calls.shard_peers
        if self._node.shards.count == 1:
            endpoints = self._advertise or asked
            if not endpoints.addresses:
                raise Refusal(rmq.Code.ILLEGAL_ACCESS_POINT, "endpoints: name the address you "
                              "reach the cluster at (or set rocketmq_advertise on the nodes)")
            return [_queue(topic, BROKER_NAME, endpoints)]
        queues = [_queue(topic, f"{BROKER_NAME}-{shard}", _endpoints(address))
                  for shard, address in enumerate(await peers.rocketmq_routes()) if address]
        if not queues:
            raise Refusal(rmq.Code.INTERNAL_SERVER_ERROR, "no shard's RocketMQ listener "
                                                          "answered; retry")
        return queues

    async def _settings(self, settings: rmq.Settings, principal: Principal, context: Context
                        ) -> rmq.Settings:
        answer = rmq.Settings()
        answer.CopyFrom(settings)
        answer.metric.CopyFrom(rmq.Metric(on=False))
        if settings.WhichOneof("pub_sub") == "publishing":
            answer.backoff_policy.CopyFrom(rmq.RetryPolicy(
                max_attempts=PRODUCER_ATTEMPTS, exponential_backoff=PRODUCER_BACKOFF))
            answer.publishing.max_body_size = self._node.limits.max_body_bytes
            return answer
        if settings.WhichOneof("pub_sub") != "subscription":
            return answer
        subscription = answer.subscription
        group = convert.check_resource(subscription.group, "settings.subscription.group")
        for index, entry in enumerate(subscription.subscriptions):
            field = f"settings.subscription.subscriptions[{index}]"
            topic = convert.check_resource(entry.topic, f"{field}.topic")
            convert.TagFilter(entry.expression, f"{field}.expression")
            # the group exists from now on: what comes due is kept for it
            await self._calls.perform(context, "CreateGroup",
                                      pb.GroupRequest(topic=topic, group=group), principal,
                                      pb.GroupResponse)
        subscription.fifo = False
        if not subscription.receive_batch_size:
            subscription.receive_batch_size = DEFAULT_BATCH
        if not subscription.HasField("long_polling_timeout"):
            subscription.long_polling_timeout.CopyFrom(
                convert.ms_duration(DEFAULT_LONG_POLL_MS))
        answer.backoff_policy.CopyFrom(_consumer_backoff(self._node.retry))
        return answer




def _queue(topic: str, broker: str, endpoints: rmq.Endpoints) -> rmq.MessageQueue:
    """Queue 0 of ``broker``: a queue is named by its broker and its number, and the Node.js
    client (1.0.8) receives from queues numbered 0 alone."""
    return rmq.MessageQueue(
        topic=rmq.Resource(name=topic), id=0, permission=rmq.Permission.READ_WRITE,
        broker=rmq.Broker(name=broker, id=0, endpoints=endpoints),
        accept_message_types=[rmq.MessageType.NORMAL, rmq.MessageType.DELAY])


def _invalid_receipt(field: str) -> rmq.Status:
    return rmq.Status(code=rmq.Code.INVALID_RECEIPT_HANDLE,
                      message=f"{field}: names no current lease of this group (acknowledged, "
                              "run out, or never given)")


def _unsupported(response_class: type[ResponseT], what: str) -> ResponseT:
    return response_class(status=rmq.Status(
        code=rmq.Code.UNSUPPORTED, message=f"tickwheel does not serve {what}"))


def _consumer_backoff(retry: RetryPolicy) -> rmq.RetryPolicy:
    """The node's retry ladder, as the delays a PushConsumer waits after each failure."""
    delays = [convert.ms_duration(retry.levels.delay_ms(retry.start_level + attempt - 1)[0])
              for attempt in range(1, retry.max_attempts)] or [convert.ms_duration(0)]
    return rmq.RetryPolicy(max_attempts=retry.max_attempts,
                           customized_backoff=rmq.CustomizedBackoff(next=delays))


def _endpoints(address: str) -> rmq.Endpoints:
    host, _, port = address.rpartition(":")
    scheme = rmq.AddressScheme.DOMAIN_NAME
    if host.replace(".", "").isdigit():
        scheme = rmq.AddressScheme.IPv4
    elif ":" in host:
        scheme, host = rmq.AddressScheme.IPv6, host.strip("[]")
    return rmq.Endpoints(scheme=scheme, addresses=[rmq.Address(host=host, port=int(port))])


