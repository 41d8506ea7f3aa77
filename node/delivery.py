"""Consumer delivery on the leader: per-topic ready queues, credits, acks, visibility timeouts.

The Raft thread hands due messages over (`Hub.deliver`, a `DeliverySink`); from there the asyncio
loop owns them. Each message waits in its topic's *ready* queue until a consumer of the topic has
a credit; it is then sent and waits *unacked*. An acknowledgement makes it done and is passed to
`Replica.ack`, which lets the cursor move over it. A message whose consumer's stream closes goes
back to the front of the ready queue and is sent again at once with ``attempt + 1``.

A *nack*, or a visibility timeout running out, retries the message through the wheel
(`Replica.reschedule`): a copy with the same id and ``attempt + 1`` is filed after the next
step of the retry ladder, or in ``%DLQ%<topic>`` after the last attempt (`RetryPolicy`), in
the same replicated command that retires the original. Until that command is applied the
original stays in flight (not sendable, not acknowledgeable, still holding the cursor); once
it is, the original is done and passed to `Replica.ack` like an acknowledgement. If the
command fails, the original goes back to the ready queue.

Consumers of a topic compete: messages go round-robin to those with credits, in batches of up to
``max_batch_msgs``. Nothing is sent without the lease (`Replica.may_deliver`): a leader paused
past its lease holds its queues until the Raft thread notices that it no longer leads, and then
drops them (`dispatch_stopped`); the new leader re-sends from the replicated cursor.

Memory: the dispatcher bounds what is out (``max_inflight_msgs`` / ``max_inflight_bytes``):
ready and unacked messages together.

Thread contract: `dispatch_started`, `deliver` and `dispatch_stopped` may be called from any
thread (they hop onto the loop); everything else runs on the loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from tickwheel.node.journal import DeliveryJournal
from tickwheel.node.levels import RetryPolicy
from tickwheel.node.metrics import Metrics
from tickwheel.replication.dispatcher import Delivery
from tickwheel.replication.replica import Replica
from tickwheel.replication.state import Retried
from tickwheel.wheel import Cursor, NewMessage
from tickwheel.wheel.errors import NotLeader, TickwheelError

log = logging.getLogger("tickwheel.delivery")

_RETRY_LEASE_S = 0.01


@dataclass(frozen=True, slots=True)
class HubConfig:
    default_visibility_timeout_ms: int = 30_000
    max_batch_msgs: int = 256
    """Messages sent to a consumer in one response."""
    max_batch_bytes: int = 4 << 20
    """Bodies in one response (a larger single body goes alone)."""
    expiry_check_ms: int = 50
    """How often visibility timeouts are checked (their resolution)."""


@dataclass(eq=False, slots=True)
class Pending:
    """One due message held by the leader, from hand-over to acknowledgement."""

    delivery: Delivery
    receipt: str
    attempt: int = 0
    delivered_at_ms: int = 0
    consumer: Consumer | None = None
    done: bool = False


@dataclass(eq=False)
class Consumer:
    """One `Receive` stream."""

    topic: str
    name: str
    visibility_timeout_ms: int
    credits: int
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    unacked: dict[str, Pending] = field(default_factory=dict)
    closed: BaseException | None = None

    async def next_batch(self) -> list[Pending]:
        """The next messages to send; raises the reason once the consumer is closed."""
        batch = await self.outbox.get()
        if batch is None:
            raise self.closed
        return batch

    def close(self, reason: BaseException) -> None:
        """End the stream: `next_batch` raises ``reason`` (the first reason given wins)."""
        if self.closed is None:
            self.closed = reason
            self.outbox.put_nowait(None)


@dataclass(eq=False)
class _Topic:
    ready: deque[Pending] = field(default_factory=deque)
    consumers: deque[Consumer] = field(default_factory=deque)
    unacked: int = 0

    def ready_count(self) -> int:
        return sum(1 for pending in self.ready if not pending.done)


class Hub:
    """The leader's consumer delivery. Create it on the loop that will own it."""

    def __init__(self, config: HubConfig, retry: RetryPolicy, clock_ms: Callable[[], int],
                 journal: DeliveryJournal, metrics: Metrics) -> None:
        self.config = config
        self._retry_policy = retry
        self._clock_ms = clock_ms
        self._journal = journal
        self._metrics = metrics
        self._replica: Replica | None = None
        self._loop = asyncio.get_running_loop()
        self._topics: dict[str, _Topic] = {}
        self._pending: dict[str, Pending] = {}
        self._expiries: list[tuple[float, int, list[tuple[Pending, int]]]] = []
        """One entry per batch sent: (deadline, sequence, [(message, attempt sent)])."""
        self._sequence = itertools.count()
        self._epoch: int | None = None
        self._term = 0
        self._lease_retry: asyncio.TimerHandle | None = None
        self._expiry_task = self._loop.create_task(self._expire_forever())

    def attach(self, replica: Replica) -> None:
        """The replica this hub is the sink of (it is created with the hub as its sink)."""
        self._replica = replica

    # -- from the Raft thread (a DeliverySink) --------------------------------------------

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._loop.call_soon_threadsafe(self._start, term, epoch, cursor, takeover_ms)

    def deliver(self, deliveries: list[Delivery]) -> None:
        self._loop.call_soon_threadsafe(self._enqueue, deliveries)

    def dispatch_stopped(self, epoch: int) -> None:
        self._loop.call_soon_threadsafe(self._stop)

    # -- on the loop ----------------------------------------------------------------------

    @property
    def dispatching(self) -> bool:
        return self._epoch is not None

    def subscribe(self, topic: str, name: str, credits: int,
                  visibility_timeout_ms: int) -> Consumer:
        """A new consumer of ``topic``; raises `NotLeader` unless this node leads. A new leader
        takes consumers before it starts dispatching, so they are ready when it does."""
        if self._epoch is None and not self._replica.is_leader():
            raise NotLeader(self._replica.leader_hint())
        consumer = Consumer(topic, name, visibility_timeout_ms, credits)
        state = self._topics.setdefault(topic, _Topic())
        state.consumers.append(consumer)
        log.info("event=consumer_joined topic=%s consumer=%r credits=%d visibility_timeout_ms=%d",
                 topic, name, credits, visibility_timeout_ms)
        self._pump(state)
        return consumer

    def unsubscribe(self, consumer: Consumer) -> None:
        """The consumer's stream ended: its unacknowledged messages are sent again at once."""
        state = self._topics.get(consumer.topic)
        if state is None or consumer not in state.consumers:
            return
        state.consumers.remove(consumer)
        returned = list(consumer.unacked.values())
        consumer.unacked.clear()
        for pending in reversed(returned):
            self._return(state, pending)
        log.info("event=consumer_left topic=%s consumer=%r returned=%d", consumer.topic,
                 consumer.name, len(returned))
        self._pump(state)
        self._forget_if_idle(consumer.topic)

    def grant(self, consumer: Consumer, credits: int) -> None:
        consumer.credits += credits
        state = self._topics.get(consumer.topic)
        if state is not None:
            self._pump(state)

    def acknowledge(self, consumer: Consumer, receipts: list[str]) -> int:
        """Mark messages done; returns how many were still waiting. A receipt of another
        consumer, a redelivered message or an earlier leadership is accepted or ignored alike:
        done is done."""
        positions = []
        epoch = self._epoch
        held_by: set[Consumer] = set()
        for receipt in receipts:
            pending = self._pending.pop(receipt, None)
            if pending is None:
                continue
            pending.done = True
            holder = pending.consumer
            if holder is not None:
                holder.unacked.pop(receipt, None)
                self._topics[holder.topic].unacked -= 1
                held_by.add(holder)
            message = pending.delivery.message
            positions.append(Cursor(message.slot_second, message.local_index))
        for holder in held_by:
            self._forget_if_idle(holder.topic)
        if positions and epoch is not None:
            self._replica.ack(epoch, positions)
            self._metrics.acked.labels(self._metrics.topic(consumer.topic)).inc(len(positions))
        return len(positions)

    def nack(self, consumer: Consumer, receipts: list[str]) -> int:
        """Retry messages the consumer could not handle (see the module docstring); returns
        how many were still waiting. Unknown, done or already retried receipts are ignored."""
        nacked = []
        for receipt in receipts:
            pending = self._pending.get(receipt)
            if pending is not None and pending.consumer is not None:
                self._take_back(pending)
                nacked.append(pending)
        self._retry(nacked, "nack")
        return len(nacked)

    def topics(self) -> list[tuple[str, int, int, int]]:
        """``(topic, ready, unacked, consumers)`` for every topic with anything in it."""
        return [(name, state.ready_count(), state.unacked, len(state.consumers))
                for name, state in sorted(self._topics.items())
                if state.ready or state.unacked or state.consumers]

    def close(self) -> None:
        self._expiry_task.cancel()
        self._stop()

    # -- internals ------------------------------------------------------------------------

    def _start(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._epoch, self._term = epoch, term
        self._journal.dispatch_started(term, epoch, cursor, takeover_ms)

    def _stop(self) -> None:
        """Leadership ended: drop every message and close every consumer (they reconnect to
        the new leader)."""
        epoch, self._epoch = self._epoch, None
        self._pending.clear()
        self._expiries.clear()
        reason = NotLeader(self._replica.leader_hint())
        for state in self._topics.values():
            for consumer in state.consumers:
                consumer.close(reason)
        self._topics.clear()
        log.info("event=delivery_stopped epoch=%s", epoch)

    def _enqueue(self, deliveries: list[Delivery]) -> None:
        touched = {}
        epoch = self._epoch
        for delivery in deliveries:
            if delivery.epoch != epoch:
                continue
            message = delivery.message
            receipt = f"{epoch}.{message.slot_second}.{message.local_index}"
            pending = Pending(delivery, receipt, attempt=message.attempt - 1)
            self._pending[receipt] = pending
            state = touched.get(message.topic)
            if state is None:
                state = touched[message.topic] = self._topics.setdefault(message.topic, _Topic())
            state.ready.append(pending)
        for state in touched.values():
            self._pump(state)

    def _forget_if_idle(self, topic: str) -> None:
        """Keep no state for a topic with no messages and no consumers: topics come and go."""
        state = self._topics.get(topic)
        if state is not None and not (state.ready or state.unacked or state.consumers):
            del self._topics[topic]

    def _take_back(self, pending: Pending) -> None:
        """A sent message leaves its consumer (nack, visibility timeout) for a retry copy."""
        consumer = pending.consumer
        consumer.unacked.pop(pending.receipt, None)
        self._topics[consumer.topic].unacked -= 1
        pending.consumer = None
        del self._pending[pending.receipt]
        self._forget_if_idle(consumer.topic)

    def _retry(self, pendings: list[Pending], reason: str) -> None:
        """Propose a retry copy of each message; `_retried` finishes when it is applied."""
        if not pendings:
            return
        now_ms, epoch = self._clock_ms(), self._epoch
        copies = []
        for pending in pendings:
            message = pending.delivery.message
            topic, delay_ms = self._retry_policy.next_copy(message.topic, pending.attempt)
            copies.append((message.handle, NewMessage(
                message.id, topic, message.body, now_ms + delay_ms, message.properties,
                pending.attempt + 1)))
        try:
            future = self._replica.reschedule(copies)
        except TickwheelError as error:
            self._retry_failed(pendings, error)
            return
        future.add_done_callback(lambda done: self._loop.call_soon_threadsafe(
            self._retried, epoch, pendings, copies, done, reason))

    def _retried(self, epoch: int, pendings: list[Pending],
                 copies: list[tuple[int, NewMessage]], done: Future, reason: str) -> None:
        """The reschedule command was applied (or failed): retired originals are done."""
        if epoch != self._epoch:
            return  # leadership ended: the next leader has the original or the copy
        if done.exception() is not None:
            self._retry_failed(pendings, done.exception())
            return
        positions, refused = [], []
        for pending, (_, copy), result in zip(pendings, copies, done.result(), strict=True):
            if not isinstance(result, Retried):
                refused.append((pending, result.error))
                continue
            pending.done = True
            positions.append(pending.delivery.message.position)
            topic = pending.delivery.message.topic
            counter = self._metrics.retried if copy.topic == topic else (
                self._metrics.dead_lettered)
            counter.labels(self._metrics.topic(topic)).inc()
            log.info("event=message_retried reason=%s id=%r topic=%s attempt=%d to_topic=%s "
                     "deliver_at_ms=%d handle=%s", reason, copy.id, topic, pending.attempt,
                     copy.topic, copy.deliver_at_ms, result.handle)
        if positions:
            self._replica.ack(epoch, positions)
        if refused:
            self._retry_failed([pending for pending, _ in refused], refused[0][1])

    def _retry_failed(self, pendings: list[Pending], error: BaseException) -> None:
        """The retry copy was not filed: the original is sent again at once, as it is."""
        log.warning("event=retry_failed messages=%d error=%r", len(pendings), error)
        touched = {}
        for pending in pendings:
            self._pending[pending.receipt] = pending
            topic = pending.delivery.message.topic
            state = touched[topic] = self._topics.setdefault(topic, _Topic())
            self._requeue(state, pending)
        for state in touched.values():
            self._pump(state)

    def _return(self, state: _Topic, pending: Pending) -> None:
        pending.consumer = None
        state.unacked -= 1
        self._requeue(state, pending)

    def _requeue(self, state: _Topic, pending: Pending) -> None:
        state.ready.appendleft(pending)
        self._metrics.redelivered.labels(
            self._metrics.topic(pending.delivery.message.topic)).inc()

    def _pump(self, state: _Topic) -> None:
        """Send ready messages to consumers with credits, round-robin, while the lease holds."""
        if not state.ready or not state.consumers:
            return
        if not self._replica.may_deliver():
            if self._lease_retry is None:
                self._lease_retry = self._loop.call_later(_RETRY_LEASE_S, self._retry_all)
            return
        while state.ready and any(consumer.credits for consumer in state.consumers):
            for _ in range(len(state.consumers)):
                consumer = state.consumers[0]
                state.consumers.rotate(-1)
                if consumer.credits > 0:
                    self._send(state, consumer)

    def _send(self, state: _Topic, consumer: Consumer) -> None:
        batch = []
        now_ms = self._clock_ms()
        deadline_s = time.monotonic() + consumer.visibility_timeout_ms / 1000
        limit = min(consumer.credits, self.config.max_batch_msgs)
        size = 0
        while state.ready and len(batch) < limit and size < self.config.max_batch_bytes:
            pending = state.ready.popleft()
            if pending.done:
                continue
            size += len(pending.delivery.message.body)
            pending.attempt += 1
            pending.delivered_at_ms = now_ms
            pending.consumer = consumer
            consumer.unacked[pending.receipt] = pending
            batch.append(pending)
        if not batch:
            return
        heapq.heappush(self._expiries, (deadline_s, next(self._sequence),
                                        [(pending, pending.attempt) for pending in batch]))
        consumer.credits -= len(batch)
        state.unacked += len(batch)
        consumer.outbox.put_nowait(batch)
        self._journal.delivered([(p.delivery, p.attempt) for p in batch], self._term, now_ms)
        self._metrics.observe_delivered(consumer.topic, batch, now_ms)

    def _retry_all(self) -> None:
        self._lease_retry = None
        for state in self._topics.values():
            self._pump(state)

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.expiry_check_ms / 1000)
            self._expire(time.monotonic())

    def _expire(self, now_s: float) -> None:
        """A visibility timeout that runs out counts as a nack."""
        expired = []
        while self._expiries and self._expiries[0][0] <= now_s:
            for pending, attempt in heapq.heappop(self._expiries)[2]:
                if pending.done or pending.attempt != attempt or pending.consumer is None:
                    continue
                log.info("event=visibility_timeout topic=%s id=%r attempt=%d consumer=%r",
                         pending.consumer.topic, pending.delivery.message.id, attempt,
                         pending.consumer.name)
                self._take_back(pending)
                expired.append(pending)
        self._retry(expired, "visibility_timeout")
