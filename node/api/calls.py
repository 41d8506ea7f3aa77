"""What each unary call does on the leader, once its caller is known: validate the request,
authorize it as the caller's principal, hold a schedule to the principal's quotas (on the
leader only: a follower forwards it, and the leader counts it), and ask the replica or the
consumer registry. Schedules, cancels and reschedules hand the replica the principal's name
for the ledger (`ledger_name`).
`TickwheelService.perform` runs these here, or forwards the call to the leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple, TypeVar

from google.protobuf.message import Message

from tickwheel.common.errors import InvalidMessage, InvariantViolation, PermissionDenied, Retryable
from tickwheel.node.api import validation
from tickwheel.node.api.commits import WRITE_TIMEOUT_S, applied, committed
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.growth import Predecessors, grow_shards
from tickwheel.node.api.placement import refused_handle
from tickwheel.node.api.shard_peers import ShardPeers
from tickwheel.node.api.upgrade import finalize_upgrade
from tickwheel.node.delivery.sent import Sent
from tickwheel.node.security.access import ANYONE, Action, Principal
from tickwheel.node.security.quotas import NOTHING_HELD
from tickwheel.replication import Accepted, HandleCipher, MoveOutcome
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.wheel import CancelResult

Handler = Callable[[Any, Principal], Awaitable[Message]]
ResponseT = TypeVar("ResponseT", bound=Message)

_CANCEL_OUTCOMES = {
    CancelResult.CANCELLED: pb.CANCEL_OUTCOME_CANCELLED,
    CancelResult.ALREADY_CANCELLED: pb.CANCEL_OUTCOME_ALREADY_CANCELLED,
    CancelResult.NOT_PENDING: pb.CANCEL_OUTCOME_NOT_PENDING,
    CancelResult.HANDED_OUT: pb.CANCEL_OUTCOME_HANDED_OUT,
}
"""What a cancel did, as the proto's enum says it (the same numbers, one by one)."""
_MOVE_OUTCOMES = {
    MoveOutcome.RESCHEDULED: pb.RESCHEDULE_OUTCOME_RESCHEDULED,
    MoveOutcome.CANCELLED: pb.RESCHEDULE_OUTCOME_CANCELLED,
    MoveOutcome.NOT_PENDING: pb.RESCHEDULE_OUTCOME_NOT_PENDING,
    MoveOutcome.HANDED_OUT: pb.RESCHEDULE_OUTCOME_HANDED_OUT,
}
"""What a move did, as the proto's enum says it."""


class LeaderCalls:
    def __init__(self, node: NodeContext, shard_peers: ShardPeers) -> None:
        self._node = node
        self._predecessors = Predecessors(node, shard_peers)

    def handlers(self) -> dict[str, Handler]:
        """The unary methods answered on the leader, by name."""
        return {"Schedule": self.schedule, "Cancel": self.cancel,
                "Reschedule": self.reschedule, "ReceiveMessages": self.receive,
                "AckMessages": self.ack, "ChangeInvisibleDuration": self.change,
                "CreateGroup": self.create_group, "DeleteGroup": self.delete_group,
                "GrowShards": partial(grow_shards, self._node),
                "FinalizeUpgrade": partial(finalize_upgrade, self._node)}

    async def create_group(self, request: pb.GroupRequest,
                                 principal: Principal) -> pb.GroupResponse:
        replica = self._node.replica
        validation.check_topic(request.topic, "topic", dead_letter=True)
        validation.check_group(request.group, "group")
        # what subscribing to a new group does anyway (the RocketMQ listener creates a
        # consumer's groups when it announces them)
        require(principal, Action.CONSUME, request.topic, "topic", request.group)
        existed = replica.groups().get(request.topic, request.group) is not None
        try:
            await asyncio.wait_for(self._node.courier.ensure_group(request.topic, request.group),
                                   WRITE_TIMEOUT_S)
        except TimeoutError:
            raise Retryable("not committed in time; retry") from None
        return pb.GroupResponse(existed=existed)

    async def delete_group(self, request: pb.GroupRequest,
                                 principal: Principal) -> pb.GroupResponse:
        validation.check_topic(request.topic, "topic", dead_letter=True)
        validation.check_group(request.group, "group")
        require(principal, Action.ADMIN, request.topic, "topic", request.group)
        existed = await applied(self._node.replica.delete_group(request.topic, request.group))
        return pb.GroupResponse(existed=existed)

    async def schedule(self, request: pb.ScheduleRequest,
                             principal: Principal) -> pb.ScheduleResponse:
        node = self._node
        if not principal.unlimited(Action.SCHEDULE):
            checked_topic = None
            for index, message in enumerate(request.messages):
                if message.topic != checked_topic:
                    require(principal, Action.SCHEDULE, message.topic,
                             f"messages[{index}].topic")
                    checked_topic = message.topic
        checked = validation.new_messages(request.messages, node.clock.now_ms(), node.limits,
                                          node.retry.levels)
        shards = node.shards
        shards.place(request.messages, checked.messages)
        elsewhere = await self._predecessors.remembered(shards, request.messages,
                                                        checked.messages)
        messages = checked.messages if not elsewhere else [
            m for index, m in enumerate(checked.messages) if index not in elsewhere]
        node.disk.check()
        held = (node.quotas.admit_schedule(principal, len(messages), request.ByteSize)
                if principal.quota.bounds() and node.replica.is_leader() else NOTHING_HELD)
        try:
            results = await committed(node.replica.schedule(messages, shards.version,
                                                            ledger_name(principal)))
        finally:
            held.release()
        node.metrics.scheduled.inc(sum(1 for r in results if not r.duplicate))
        response = pb.ScheduleResponse()
        add = response.results.add  # in place: a ScheduleResult built apart is copied in
        handles = iter(node.replica.handle_cipher().encode(
            [r.handle for r in results if isinstance(r, Accepted)]))
        if elsewhere:  # answered by the shard they were scheduled on before a growth
            results = _with_earlier(results, elsewhere, len(checked.messages))
        for m, r, clamped in zip(checked.messages, results, checked.clamped_levels,
                                 strict=True):
            if isinstance(r, Accepted):
                result = add(id=m.id, handle=next(handles), deliver_at_ms=r.deliver_at_ms)
                if r.duplicate or clamped:  # rare: default fields passed cost 0.3 us a message
                    result.duplicate = r.duplicate
                    result.clamped_delay_level = clamped
            elif isinstance(r, _Earlier):
                add(id=m.id, handle=r.handle, deliver_at_ms=r.deliver_at_ms, duplicate=True,
                    clamped_delay_level=clamped)
        return response

    async def cancel(self, request: pb.CancelRequest,
                           principal: Principal) -> pb.CancelResponse:
        if not request.handles:
            raise InvalidMessage("handles", "is empty")
        if len(request.handles) > self._node.limits.max_batch_msgs:
            raise InvalidMessage("handles", f"has {len(request.handles)}, at most "
                                 f"{self._node.limits.max_batch_msgs}")
        handles = []
        for index, handle in enumerate(self._node.replica.handle_cipher().decode(
                request.handles)):
            if handle is None:
                raise refused_handle(f"handles[{index}]", request.handles[index],
                                     self._node.replica.shard)
            handles.append(handle)
        results = await committed(self._node.replica.cancel(
            handles, may(principal, Action.CANCEL), ledger_name(principal)))
        self._node.metrics.cancelled.inc(results.count(CancelResult.CANCELLED))
        return pb.CancelResponse(cancelled=[outcome.cancelled for outcome in results],
                                 outcomes=[_CANCEL_OUTCOMES[outcome] for outcome in results])

    async def reschedule(self, request: pb.RescheduleRequest,
                               principal: Principal) -> pb.RescheduleResponse:
        node = self._node
        times = validation.move_times(request.moves, node.clock.now_ms(), node.limits)
        moves = []
        cipher = node.replica.handle_cipher()
        for index, handle in enumerate(cipher.decode([move.handle for move in request.moves])):
            if handle is None:
                raise refused_handle(f"moves[{index}].handle", request.moves[index].handle,
                                     node.replica.shard)
            moves.append((handle, times[index]))
        node.disk.check()  # a move files the message again
        results = await committed(node.replica.reschedule(moves, may(principal, Action.CANCEL),
                                                          ledger_name(principal)))
        node.metrics.rescheduled.inc(sum(r.outcome is MoveOutcome.RESCHEDULED for r in results))
        return pb.RescheduleResponse(results=[
            pb.RescheduleResult(outcome=_MOVE_OUTCOMES[r.outcome], deliver_at_ms=r.deliver_at_ms)
            for r in results])

    async def receive(self, request: pb.ReceiveMessagesRequest,
                            principal: Principal) -> pb.ReceiveResponse:
        node = self._node
        invisible_ms, wait_ms = validation.check_receive(
            request, node.limits, node.courier.config.default_visibility_timeout_ms)
        require(principal, Action.CONSUME, request.topic, "topic", request.group)
        batch = await node.unary.receive(request.topic, request.group, request.consumer,
                                         request.max_messages, invisible_ms, wait_ms / 1000)
        return receive_response(batch, request.group, node.replica.address,
                                 node.replica.handle_cipher())

    async def ack(self, request: pb.SettleRequest,
                        principal: Principal) -> pb.SettleResponse:
        validation.check_settle(request, self._node.limits, change=False)
        require(principal, Action.CONSUME, request.topic, "topic", request.group)
        return pb.SettleResponse(settled=await self._node.unary.settle(
            request.topic, request.group, list(request.receipts), None))

    async def change(self, request: pb.SettleRequest,
                           principal: Principal) -> pb.SettleResponse:
        validation.check_settle(request, self._node.limits, change=True)
        require(principal, Action.CONSUME, request.topic, "topic", request.group)
        return pb.SettleResponse(settled=await self._node.unary.settle(
            request.topic, request.group, list(request.receipts),
            request.invisible_duration_ms))


def ledger_name(principal: Principal) -> str:
    """The principal as the ledger names it: as its grants do; ``""`` for `ANYONE` (a node
    without authentication knows no one)."""
    return "" if principal is ANYONE else principal.name


def answer_of(method: str, response: Message, answer: type[ResponseT]) -> ResponseT:
    """``response`` as the ``answer`` unary ``method`` gives: a `Handler`, and a call forwarded
    by name, say only that they answer a message."""
    if not isinstance(response, answer):
        raise InvariantViolation(f"{method} answered a {type(response).__name__}")
    return response


class _Earlier(NamedTuple):
    """A message another shard scheduled before the map grew: its handle as that shard's
    clients see it."""

    handle: int
    deliver_at_ms: int


def _with_earlier(results: list[object], earlier: dict[int, tuple[int, int]],
                  count: int) -> list[object]:
    """The results of a request of ``count`` messages: ``earlier``'s at their indexes, and
    those of the rest (``results``, in order) between."""
    rest = iter(results)
    return [_Earlier(*earlier[index]) if index in earlier else next(rest)
            for index in range(count)]


def require(principal: Principal, action: Action, topic: str, field: str,
             group: str | None = None) -> None:
    """Raise `PermissionDenied` naming ``field`` unless ``principal`` may."""
    if not principal.may(action, topic, group):
        of_group = "" if group is None else f" in group {group!r}"
        raise PermissionDenied(field, f"principal {principal.name!r} may not {action} on "
                                      f"topic {topic!r}{of_group}")


def may(principal: Principal, action: Action) -> Callable[[str], bool] | None:
    """What the replica asks of a handle's topic before it proposes a cancel or a move
    (a handle does not say its topic: the replica reads it); None when every topic is
    allowed."""
    if principal.unlimited(action):
        return None
    return lambda topic: principal.may(action, topic)


def receive_response(batch: list[Sent], group: str, node: str,
                      cipher: HandleCipher) -> pb.ReceiveResponse:
    """Messages are added in place (a Delivered built apart is copied in: 1.6 times slower),
    and an empty properties map is not converted per message."""
    response = pb.ReceiveResponse()
    add = response.messages.add
    handles = cipher.encode([sent.delivery.message.handle for sent in batch])
    for sent, handle in zip(batch, handles, strict=True):
        delivery = sent.delivery
        message = delivery.message
        delivered = add(id=message.id, topic=message.topic, body=message.body,
                        deliver_at_ms=message.deliver_at_ms,
                        delivered_at_ms=sent.delivered_at_ms, attempt=sent.attempt,
                        possible_duplicate=delivery.possible_duplicate,
                        receipt=sent.receipt, handle=handle, node=node, group=group,
                        hold_ms=sent.hold_ms)
        if sent.properties:
            delivered.properties.update(sent.properties)
    return response
