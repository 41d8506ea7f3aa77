"""Consumer streams on the leader: subscriptions, credits, sending, acks, nacks, retries.

Which consumer gets which message is decided by the replica, as replicated leases
(`tickwheel.replication.handout`); the `Courier` is the streams' side of it. A `Receive` stream
subscribes to a consumer group of a topic (the group is created by a replicated command if it
is new), joins the replica's planner with its credits, and gets each message once its lease is
applied (`Courier.deliver`, a `DeliverySink`). Receipts name the lease (group, message, lease
number, a random nonce): an ack or nack with a receipt of another group, or one never granted,
changes nothing. A stream's leases end with the stream (its messages are ready again at once,
and the next lease of each is flagged ``possible_duplicate``). A stream that has acked
nothing is closed once ``max_unacked_timeouts`` of its leases ran out
(`tickwheel.node.delivery.no_acks`).

A *nack*, or a lease deadline (the visibility timeout) passing, retries the message through the
wheel (`tickwheel.node.delivery.retries`): a copy with the same id and ``attempt + 1``, for
this group only, after the next step of the retry ladder, or in the group's dead-letter topic
after the last attempt (`RetryPolicy`): ``%DLQ%<topic>`` for the default group,
``%DLQ%<group>`` for a named one, as RocketMQ does. The copy and the end of the lease are one
replicated command.

A consumer is a `Session` (`tickwheel.node.delivery.sessions`); which leases its receipts may
settle is `tickwheel.node.delivery.receipts`.

Nothing is sent without the leader's tenure (`Replica.may_deliver`): a leader paused past it
holds what it has until the Raft thread notices that it no longer leads, and then drops it
(`dispatch_stopped`); the log still holds the leases, which the next leader honours.

Thread contract: `dispatch_started`, `deliver`, `expired` and `dispatch_stopped` may be called
from any thread (they hop onto the loop); everything else runs on the loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tickwheel.common.errors import InvariantViolation, NotLeader, Overloaded, TickwheelError
from tickwheel.node.delivery import no_acks
from tickwheel.node.delivery.batches import ENVELOPE_BYTES, GRPC_MESSAGE_BYTES, split
from tickwheel.node.delivery.levels import RetryPolicy
from tickwheel.node.delivery.receipts import Receipts
from tickwheel.node.delivery.retries import Retries, RetryItem
from tickwheel.node.delivery.sent import Sent, sent_rows
from tickwheel.node.delivery.sessions import Session
from tickwheel.node.ops.metrics import Metrics
from tickwheel.replication import (
    DEFAULT_GROUP,
    STREAM,
    TARGET_GROUP_PROPERTY,
    ConsumerSlot,
    Delivery,
    Expired,
    LeaseRef,
    LedgerRows,
    LedgerSink,
    Replica,
    encode_receipts,
)
from tickwheel.wheel import Cursor

log = logging.getLogger("tickwheel.delivery")

_RETRY_TENURE_S = 0.01
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CourierConfig:
    default_visibility_timeout_ms: int = 30_000
    max_batch_msgs: int = 256
    """Messages sent to a consumer in one response."""
    max_batch_bytes: int = GRPC_MESSAGE_BYTES - ENVELOPE_BYTES
    """Bytes of messages (`tickwheel.node.delivery.batches.delivered_bytes`) sent to a consumer
    in one response, whatever its credits: under the gRPC message limit, with room for the
    envelope."""
    max_hold_ms: int = 4
    """A message granted ahead of its due time waits for the others of its hand-out due
    within this long after it, and goes with them at the last one's due time: one send (and
    one ack, one credit back) instead of one per due millisecond. A message with nothing due
    soon after it goes at its own due time; one already due goes at once. To a consumer that
    holds (``Subscribe.hold``) they all go at once, each with the wait it would have had."""
    max_unacked_timeouts: int = 3
    """A stream that has acked nothing is closed once this many of its leases ran out their
    visibility timeout (`tickwheel.node.delivery.no_acks`); 0: never."""


class Courier:
    """The leader's consumer sessions: hands them the messages leased to them, takes their acks
    and nacks. Create it on the loop that will own it."""

    def __init__(self, config: CourierConfig, retry: RetryPolicy, clock_ms: Callable[[], int],
                 ledger: LedgerSink | None, metrics: Metrics) -> None:
        self.config = config
        self._retry_policy = retry
        self._clock_ms = clock_ms
        self._ledger = ledger
        self._metrics = metrics
        self._attached: Replica | None = None
        self._loop = asyncio.get_running_loop()
        self._consumers: dict[int, Session] = {}
        self._keys = itertools.count(1)
        self._held: list[Delivery] = []
        """Granted while the leader's tenure had lapsed: sent once it holds again."""
        self._epoch: int | None = None
        self._term = 0
        self._stops = 0
        """How many times leadership ended here (`_stop`)."""
        self._tenure_retry: asyncio.TimerHandle | None = None
        self.released_bytes = 0
        """Bytes of the bodies that streams held unacknowledged when they left, ever: freed
        once their leases' release is applied (`tickwheel.node.ops.allocator` then gives the
        memory back)."""
        self.receipts = Receipts(metrics)
        self._retries = Retries(retry, clock_ms, metrics, self._loop, lambda: self._replica)

    def attach(self, replica: Replica) -> None:
        """The replica this courier is the sink of (it is created with the courier as its sink)."""
        self._attached = replica

    @property
    def _replica(self) -> Replica:
        """The replica, attached before any consumer or delivery comes."""
        if self._attached is None:
            raise InvariantViolation("the courier was used before its replica was attached")
        return self._attached

    # -- from the Raft thread (a DeliverySink) --------------------------------------------

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._loop.call_soon_threadsafe(self._start, term, epoch, cursor, takeover_ms)

    def deliver(self, deliveries: list[Delivery]) -> None:
        self._loop.call_soon_threadsafe(self._send_all, deliveries)

    def expired(self, leases: list[Expired]) -> None:
        self._loop.call_soon_threadsafe(self._expire, leases)

    def dispatch_stopped(self, epoch: int) -> None:
        self._loop.call_soon_threadsafe(self._stop)

    # -- on the loop ----------------------------------------------------------------------

    @property
    def dispatching(self) -> bool:
        return self._epoch is not None

    async def subscribe(self, topic: str, group: str, name: str, credits: int,
                        visibility_timeout_ms: int, mode: int = STREAM,
                        hold: bool = False) -> Session:
        """A new consumer of ``group`` of ``topic`` (the group is created if new), which
        holds messages sent ahead of their due time if ``hold``; raises `NotLeader` unless
        this node leads. A new leader takes consumers before it starts dispatching, so they
        are ready when it does."""
        replica = self._replica
        if not replica.is_leader():
            raise NotLeader(replica.leader_hint())
        stops = self._stops
        await self.ensure_group(topic, group)
        if self._stops != stops or not replica.is_leader():
            # leadership ended while the group's command committed: `_stop` has closed this
            # leader's consumers, and a consumer joined after it would never hear of it nor
            # be given a message: its stream would stay open and silent
            raise NotLeader(replica.leader_hint())
        consumer = Session(next(self._keys), topic, group, name, visibility_timeout_ms,
                            credits, mode, hold)
        self._consumers[consumer.key] = consumer
        replica.join(ConsumerSlot(consumer.key, topic, group, credits, visibility_timeout_ms,
                                  mode))
        log.info("event=consumer_joined topic=%s group=%r consumer=%r credits=%d "
                 "visibility_timeout_ms=%d hold=%s", topic, group, name, credits,
                 visibility_timeout_ms, hold)
        if group == DEFAULT_GROUP and replica.groups().of_topic(topic):
            # a named group may have been created while this consumer was joining
            await self.ensure_group(topic, group)
        return consumer

    async def ensure_group(self, topic: str, group: str) -> None:
        """Make sure ``(topic, group)`` exists (raises `Overloaded` at ``max_groups``). A
        topic's default group is implicit until the topic has a named group: then, if this
        leader has consumers of the default group, it is created too, so they keep getting
        the topic's messages."""
        replica = self._replica
        if not await asyncio.wrap_future(replica.ensure_group(topic, group)):
            raise Overloaded("max_groups (named consumer groups in the cluster)")
        if group != DEFAULT_GROUP and self.consumers_of(topic, DEFAULT_GROUP):
            await asyncio.wrap_future(replica.ensure_group(topic, DEFAULT_GROUP))

    def unsubscribe(self, consumer: Session) -> None:
        """The consumer's stream ended: its stream leases are released (sent again at once)."""
        if self._consumers.pop(consumer.key, None) is None:
            return
        self._replica.leave(consumer.key)
        log.info("event=consumer_left topic=%s group=%r consumer=%r unacked=%d", consumer.topic,
                 consumer.group, consumer.name, len(consumer.unacked))
        if consumer.unacked and consumer.mode == STREAM:
            self._metrics.redelivered.labels(self._metrics.topic(consumer.topic)).inc(
                len(consumer.unacked))
            self.released_bytes += sum(len(sent.delivery.message.body)
                                       for sent in consumer.unacked.values())
        consumer.unacked.clear()

    def grant(self, consumer: Session, credits: int) -> None:
        consumer.credits += credits
        self._replica.credit(consumer.key, credits)

    def acknowledge(self, consumer: Session, receipts: list[str]) -> int:
        """Ack the leases of these receipts; returns how many were sent for the replica to
        check. A receipt of another group, or no receipt at all, is refused here; one never
        granted is refused when the ack is applied. Either way it changes nothing."""
        leases = self.receipts.own_leases(consumer, receipts, self._replica.groups(),
                                          self._replica.shard)
        if not leases:
            return 0
        consumer.acked = True
        try:
            future = self._replica.ack(leases, wake=False)  # nobody waits for the answer
        except TickwheelError as error:
            log.warning("event=ack_failed consumer=%r leases=%d error=%r", consumer.name,
                        len(leases), error)
            return 0
        topic = consumer.topic
        future.add_done_callback(lambda done: self._loop.call_soon_threadsafe(
            self.receipts.acked, topic, done))
        return len(leases)

    def nack(self, consumer: Session, receipts: list[str]) -> int:
        """Retry messages the consumer could not handle (see the module docstring); returns
        how many. Receipts this stream does not hold are ignored."""
        nacked = [consumer.unacked.pop(receipt) for receipt in receipts
                  if receipt in consumer.unacked]
        self._retries.propose([(sent.delivery.message, sent.delivery.lease, consumer.group,
                                sent.attempt) for sent in nacked], "nack")
        return len(nacked)

    def topics(self) -> list[tuple[str, int, int, int]]:
        """``(topic, ready, unacked, consumers)`` for every topic with a group."""
        figures: dict[str, list[int]] = {}
        for summary in self._replica.status().groups:
            counts = figures.setdefault(summary.topic, [0, 0, 0])
            counts[0] += summary.ready
            counts[1] += summary.leased
        for consumer in self._consumers.values():
            figures.setdefault(consumer.topic, [0, 0, 0])[2] += 1
        return [(topic, ready, unacked, consumers)
                for topic, (ready, unacked, consumers) in sorted(figures.items())]

    def consumers_of(self, topic: str, group: str) -> int:
        return sum(1 for c in self._consumers.values() if (c.topic, c.group) == (topic, group))

    def close(self) -> None:
        self._stop()

    # -- internals ------------------------------------------------------------------------

    def _start(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._epoch, self._term = epoch, term
        if self._ledger is not None:
            self._ledger.add(LedgerRows("dispatch_started", takeover_ms, {
                "term": [term], "epoch": [epoch], "slot_second": [cursor.second],
                "local_index": [cursor.local_index]}))

    def _stop(self) -> None:
        """Leadership ended: drop what was not sent and close every consumer (they reconnect
        to the new leader)."""
        epoch, self._epoch = self._epoch, None
        self._stops += 1
        self._held.clear()
        reason = NotLeader(self._attached.leader_hint() if self._attached else None)
        for consumer in self._consumers.values():
            consumer.close(reason)
        self._consumers.clear()
        log.info("event=delivery_stopped epoch=%s", epoch)

    def _send_all(self, deliveries: list[Delivery]) -> None:
        """Send granted messages to their consumers, batched per consumer, while the leader's
        tenure holds: each at its due time (the replica grants a little ahead, so the commit
        round runs while they wait; `_windows` gathers the waits), or at once, with its wait
        to hold, to a consumer that holds; a lease of a consumer gone meanwhile is released."""
        epoch = self._epoch
        deliveries = [d for d in deliveries if d.epoch == epoch]
        if not deliveries:
            return
        if not self._replica.may_deliver():
            self._held += deliveries
            if self._tenure_retry is None:
                self._tenure_retry = self._loop.call_later(_RETRY_TENURE_S, self._send_held)
            return
        now_ms = self._clock_ms()
        batches: dict[int, list[Sent]] = {}
        orphaned = []
        for release_ms, group in self._sends_now(deliveries, now_ms):
            receipts = encode_receipts([delivery.lease for delivery in group],
                                       self._replica.shard)
            for delivery, receipt in zip(group, receipts, strict=True):
                consumer = self._consumers.get(delivery.consumer)
                if consumer is None or consumer.closed is not None:
                    orphaned.append(delivery.lease)
                    continue
                message = delivery.message
                properties = message.properties
                if TARGET_GROUP_PROPERTY in properties:
                    properties = {k: v for k, v in properties.items()
                                  if k != TARGET_GROUP_PROPERTY}
                sent = Sent(delivery, receipt, message.attempt + delivery.lease.seq - 1,
                            release_ms, properties, release_ms - now_ms)
                consumer.unacked[sent.receipt] = sent
                consumer.credits -= 1
                batches.setdefault(consumer.key, []).append(sent)
        for key, batch in batches.items():
            consumer = self._consumers[key]
            for response in split(batch, self.config.max_batch_msgs,
                                  self.config.max_batch_bytes):
                consumer.outbox.put_nowait(response)
            self._replica.sent(key, [sent.delivery.lease for sent in batch], now_ms)
            if self._ledger is not None:
                self._ledger.add(sent_rows(batch, consumer.group, consumer.name, self._term,
                                           now_ms))
            self._metrics.observe_delivered(
                consumer.topic, len(batch),
                [max(0, sent.delivered_at_ms - sent.delivery.message.deliver_at_ms)
                 for sent in batch if sent.attempt == 1])
        if orphaned:
            self._give_back(orphaned)

    def _sends_now(self, deliveries: list[Delivery], now_ms: int
                   ) -> list[tuple[int, list[Delivery]]]:
        """What goes now, as ``(release time, deliveries)``: those due, and those of consumers
        that hold, each with the end of its wait (`_windows`). The others granted ahead wait
        here, for `_send_all` at their windows' times."""
        due: list[Delivery] = []
        ahead: list[Delivery] = []
        here: list[Delivery] = []
        consumers = self._consumers
        for delivery in deliveries:
            if delivery.message.deliver_at_ms <= now_ms:
                due.append(delivery)
            elif (consumer := consumers.get(delivery.consumer)) is not None and consumer.hold:
                ahead.append(delivery)
            else:
                here.append(delivery)
        for send_ms, window in _windows(here, self.config.max_hold_ms):
            self._loop.call_later((send_ms - now_ms) / 1000, self._send_all, window)
        return [(now_ms, due), *_windows(ahead, self.config.max_hold_ms)]

    def _send_held(self) -> None:
        self._tenure_retry = None
        held, self._held = self._held, []
        self._send_all(held)

    def _give_back(self, leases: list[LeaseRef]) -> None:
        """End leases whose messages never left (their consumer went first): ready again,
        and the next delivery is not flagged for them."""
        try:
            self._replica.give_back(leases)
        except TickwheelError as error:
            log.warning("event=give_back_failed leases=%d error=%r", len(leases), error)

    def _expire(self, expired: list[Expired]) -> None:
        """A stream lease's deadline (its visibility timeout) that passes counts as a nack. A
        durable lease's deadline is the time its consumer chose to see the message again (an
        invisible duration): its retry copy is ready at once. The leases of a stream that
        has not read what it was sent are not retried: the stream is closed (`_stall`) and
        they are released with it; so are those of a stream that acked nothing, once
        ``max_unacked_timeouts`` of its leases ran out (`no_acks`)."""
        if not expired or expired[0].epoch != self._epoch:
            return
        receipts = encode_receipts([item.lease for item in expired], self._replica.shard)
        stalled = self._stalled(expired, receipts)
        bound = self.config.max_unacked_timeouts
        silent = no_acks.reaching_bound(expired, self._consumers, stalled, bound)
        retries: list[RetryItem] = []
        at_once: list[RetryItem] = []
        for item, receipt in zip(expired, receipts, strict=True):
            if item.consumer in stalled or item.consumer in silent:
                continue
            attempt = item.message.attempt + item.lease.seq - 1
            holder = self._consumers.get(item.consumer) if item.consumer is not None else None
            if holder is not None:
                holder.unacked.pop(receipt, None)
            log.info("event=visibility_timeout topic=%s group=%r id=%r attempt=%d",
                     item.message.topic, item.group, item.message.id, attempt)
            (at_once if item.durable else retries).append(
                (item.message, item.lease, item.group, attempt))
        self._retries.propose(retries, "visibility_timeout")
        self._retries.propose(at_once, "lease_deadline", at_once=True)
        for consumer in stalled.values():
            self._stall(consumer)
        for consumer in silent.values():
            no_acks.close(consumer, bound)
            self.unsubscribe(consumer)

    def _stalled(self, expired: list[Expired], receipts: list[str]) -> dict[int, Session]:
        """The streams holding an expired lease whose message was never written to them (gRPC
        has not taken the response: the consumer does not read)."""
        stalled: dict[int, Session] = {}
        for item, receipt in zip(expired, receipts, strict=True):
            holder = self._consumers.get(item.consumer) if item.consumer is not None else None
            if holder is None or holder.mode != STREAM:
                continue
            sent = holder.unacked.get(receipt)
            if sent is not None and not sent.written:
                stalled[holder.key] = holder
        return stalled

    def _stall(self, consumer: Session) -> None:
        """A stream whose messages waited unwritten past their visibility timeout does not
        read (a consumer that never reads, or one stuck for longer than it said it might
        take): left open, it would pin the bodies of every message granted to it. It is
        closed and leaves at once, its queued messages dropped and its leases released to
        the other consumers of its group, as any closed stream's are (ready again at once,
        the next lease flagged). Retrying them instead put a copy of each body through the
        Raft log: a stalled stream's whole budget at once (200 MiB: the leader grew by
        1.2 GB, and lost its followers' votes under the burst)."""
        log.warning("event=consumer_stalled topic=%s group=%r consumer=%r queued_batches=%d "
                    "unacked=%d visibility_timeout_ms=%d", consumer.topic, consumer.group,
                    consumer.name, consumer.outbox.qsize(), len(consumer.unacked),
                    consumer.visibility_timeout_ms)
        consumer.stalled()
        self.unsubscribe(consumer)


def _windows(early: list[Delivery], hold_ms: int) -> list[tuple[int, list[Delivery]]]:
    """Messages granted ahead of their due time, as the sends they wait for (`CourierConfig.
    max_hold_ms`): each send takes the first due message not taken yet and those due within
    ``hold_ms`` after it, and goes at the last one's due time."""
    early = sorted(early, key=lambda delivery: delivery.message.deliver_at_ms)
    windows = []
    start = 0
    while start < len(early):
        until_ms = early[start].message.deliver_at_ms + hold_ms
        end = start + 1
        while end < len(early) and early[end].message.deliver_at_ms <= until_ms:
            end += 1
        windows.append((early[end - 1].message.deliver_at_ms, early[start:end]))
        start = end
    return windows

