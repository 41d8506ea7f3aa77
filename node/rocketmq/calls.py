"""The native calls a RocketMQ call becomes: tried again while no leader can be reached,
consumer receives as long polls filtered by tag, acks and deadline changes by receipt, and
the renewals of a PushConsumer's leases."""

from __future__ import annotations

import asyncio
import hashlib
from typing import TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from tickwheel.client.shards import receipt_shard
from tickwheel.common.errors import QuotaExceeded, Retryable, TickwheelError
from tickwheel.node.api.calls import answer_of
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.forward import LeaderRefused
from tickwheel.node.api.server import TickwheelService
from tickwheel.node.api.validation import CONSUMER_PATTERN, MAX_RECEIVE_WAIT_MS
from tickwheel.node.rocketmq import convert
from tickwheel.node.rocketmq.binding import Context
from tickwheel.node.rocketmq.convert import Refusal
from tickwheel.node.rocketmq.renewals import LEASE_MS, Renewals
from tickwheel.node.security.access import Action, Principal
from tickwheel.replication import decode_receipt
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.rocketmq.v2 import service_pb2 as svc
from tickwheel.v1 import tickwheel_pb2 as pb

CLIENT_ID_KEY = "x-mq-client-id"
DEFAULT_LONG_POLL_MS = 20_000
LEADER_WAIT_S = 5.0
"""How long a call waits for a leader it can reach (an election takes about a second)."""
DEADLINE_MARGIN_S = 0.5
"""A long poll ends this long before the client's deadline, so its answer arrives in time."""
ResponseT = TypeVar("ResponseT", bound=Message)


class NativeCalls:
    def __init__(self, node: NodeContext, native: TickwheelService) -> None:
        self._node = node
        self._native = native
        self.renewals = Renewals(self._renew)
        """The leases of PushConsumers' messages, kept alive while their clients are."""
        self.shard_peers = native.shard_peers
        """The other shards' leaders, in a cluster of several shards."""

    async def perform(self, context: Context | None, method: str, request: Message,
                       principal: Principal, answer: type[ResponseT]) -> ResponseT:
        """The native call, which answers an ``answer``, tried again while the cluster has no
        leader it can reach (until `LEADER_WAIT_S`, or the call's deadline): RocketMQ's
        clients retry at once, without back-off (the Python producer's 8 attempts are spent
        in milliseconds), so the wait for a new leader happens here. Every call retried is
        idempotent or harmless again: sends by message id, recalls, moves of a deadline; a
        lease granted to an answer that was lost runs out."""
        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception(_no_leader), reraise=True,
                    stop=stop_after_delay(_budget_s(context)),
                    wait=wait_random_exponential(multiplier=0.05, max=0.5)):
                with attempt:
                    return answer_of(method, await self._native.perform(
                        context, method, request, principal), answer)
        except (TickwheelError, LeaderRefused) as error:
            raise convert.refusal_of(error) from None
        raise AssertionError("not reached: the last attempt raises or returns")

    async def perform_on(self, shard: int, context: Context | None, method: str,
                         request: Message, principal: Principal, answer: type[ResponseT]
                         ) -> ResponseT:
        """`perform` on ``shard``'s leader: this node's shard here, another through its
        peer listeners (`ShardPeers`), waiting for a leader as long."""
        if shard == self._node.shards.shard:
            return await self.perform(context, method, request, principal, answer)
        try:
            return await self.shard_peers.perform(shard, method, request, principal, answer,
                                                  _budget_s(context))
        except (TickwheelError, LeaderRefused) as error:
            raise convert.refusal_of(error) from None

    async def receive(self, request: svc.ReceiveMessageRequest, principal: Principal,
                       context: Context) -> tuple[list[pb.Delivered], int]:
        topic = convert.check_resource(request.message_queue.topic, "message_queue.topic")
        group = convert.check_resource(request.group, "group")
        tags = convert.TagFilter(request.filter_expression, "filter_expression")
        limits = self._node.limits
        if not 1 <= request.batch_size <= limits.max_credits:
            raise Refusal(rmq.Code.BAD_REQUEST, f"batch_size: {request.batch_size}, must be 1 "
                                                f"to {limits.max_credits}")
        renew = request.auto_renew and not request.HasField("invisible_duration")
        invisible_ms = (LEASE_MS if renew else self.invisible_ms(
            request.invisible_duration, "invisible_duration",
            least_ms=limits.min_visibility_timeout_ms))
        poll_ms = (convert.duration_ms(request.long_polling_timeout)
                   if request.HasField("long_polling_timeout") else DEFAULT_LONG_POLL_MS)
        if poll_ms < 0:
            raise Refusal(rmq.Code.ILLEGAL_POLLING_TIME, "long_polling_timeout: is negative")
        remaining_s = context.time_remaining()
        if remaining_s is not None:
            poll_ms = min(poll_ms, int((remaining_s - DEADLINE_MARGIN_S) * 1000))
        loop = asyncio.get_running_loop()
        until_s = loop.time() + max(0, min(poll_ms, MAX_RECEIVE_WAIT_MS)) / 1000
        client_id = client_id_of(context)
        consumer = _consumer_name(client_id, context)
        while True:
            wait_ms = max(0, int((until_s - loop.time()) * 1000))
            response = await self.perform(context, "ReceiveMessages", pb.ReceiveMessagesRequest(
                topic=topic, group=group, consumer=consumer,
                max_messages=request.batch_size, invisible_duration_ms=invisible_ms,
                wait_ms=wait_ms), principal, pb.ReceiveResponse)
            batch, skipped = [], []
            for message in response.messages:
                if tags.matches(message):
                    batch.append(message)
                else:
                    skipped.append(message.receipt)
            if skipped:
                await self.settle(context, principal, topic, group, skipped, None)
            if batch or wait_ms == 0:
                break
        if renew and batch:
            self.renewals.hold(client_id, principal, topic, group,
                                [m.receipt for m in batch], invisible_ms)
        return batch, invisible_ms

    async def settle(self, context: Context | None, principal: Principal, topic: str,
                      group: str, receipts: list[str], invisible_ms: int | None) -> list[bool]:
        """Ack (``invisible_ms`` None) or move the deadline of each receipt's lease; per
        receipt, whether it named a current lease (one that is no receipt at all: False)."""
        valid = [index for index, receipt in enumerate(receipts) if is_receipt(receipt)]
        settled = [False] * len(receipts)
        if valid:
            request = pb.SettleRequest(topic=topic, group=group,
                                       receipts=[receipts[i] for i in valid])
            method = "AckMessages"
            if invisible_ms is not None:
                method, request.invisible_duration_ms = "ChangeInvisibleDuration", invisible_ms
            response = await self.perform(context, method, request, principal, pb.SettleResponse)
            for index, ok in zip(valid, response.settled, strict=True):
                settled[index] = ok
        return settled

    async def _renew(self, principal: Principal, topic: str, group: str, receipts: list[str],
                     invisible_ms: int) -> list[bool]:
        if not principal.may(Action.CONSUME, topic, group):
            return [False] * len(receipts)
        return await self.settle(None, principal, topic, group, receipts, invisible_ms)

    def invisible_ms(self, duration: Duration, field: str, least_ms: int) -> int:
        invisible_ms = convert.duration_ms(duration)
        most_ms = self._node.limits.max_visibility_timeout_ms
        if not least_ms <= invisible_ms <= most_ms:
            raise Refusal(rmq.Code.ILLEGAL_INVISIBLE_TIME, f"{field}: {invisible_ms} ms, must "
                                                           f"be {least_ms} to {most_ms} ms")
        return invisible_ms


def _budget_s(context: Context | None) -> float:
    """How long a call may wait for a leader: `LEADER_WAIT_S`, within the client's deadline."""
    remaining_s = context.time_remaining() if context is not None else None
    return max(0.0, LEADER_WAIT_S if remaining_s is None else min(
        LEADER_WAIT_S, remaining_s - DEADLINE_MARGIN_S))


def _no_leader(error: BaseException) -> bool:
    """No leader yet, or the one named cannot be reached (it just died). Not a refusal over
    the principal's quota: that is answered at once, as ``TOO_MANY_REQUESTS``, which
    RocketMQ's clients back off on themselves (retried here, it passed once the bucket had
    refilled, and the quota bounded nothing)."""
    return (isinstance(error, Retryable) and not isinstance(error, QuotaExceeded)) or (
        isinstance(error, LeaderRefused) and error.code == grpc.StatusCode.UNAVAILABLE)


def client_id_of(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_KEY and isinstance(value, str):
            return value
    return ""


def _consumer_name(client_id: str, context: Context) -> str:
    """The consumer a client is on the leader: its client id, or a digest of one that is not
    fit for logs."""
    name = client_id or context.peer()
    if CONSUMER_PATTERN.fullmatch(name):
        return name
    return "rocketmq-" + hashlib.sha256(name.encode()).hexdigest()[:24]


def is_receipt(receipt: str) -> bool:
    """Whether ``receipt`` is one a node gives out, of any shard (the node it is sent to
    refuses another shard's)."""
    try:
        decode_receipt(receipt, "receipt_handle", receipt_shard(receipt))
    except TickwheelError:
        return False
    return True
