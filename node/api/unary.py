"""Receiving without a stream: `ReceiveMessages`, `AckMessages`, `ChangeInvisibleDuration`.

A receive-then-disconnect consumer (RocketMQ 5's SimpleConsumer, anything HTTP-shaped) asks
for a batch, goes away, and settles the receipts later, from any connection. Its leases are
*durable*: they end when acked, or when their deadline (the invisible duration) passes, which
retries the message as a visibility timeout does; a leader change keeps them (only stream
leases end with a leadership).

Each ``(topic, group, consumer name)`` is one consumer of the `Courier`, kept between calls (and
dropped after `IDLE_S` without one): a call gives it credits for its batch, waits for the first
messages, lingers a little for the ones granted with them (the hand-out runs ahead of the due
time), and takes the credits it did not use back. What was granted meanwhile stays in the
consumer's outbox for its next call; if none comes, those leases run out and retry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tickwheel.node.api.commits import committed
from tickwheel.node.delivery.batches import fitting
from tickwheel.node.delivery.courier import Courier
from tickwheel.node.delivery.sent import Sent
from tickwheel.node.delivery.sessions import Session
from tickwheel.replication import DURABLE, LeaseRef, Replica, decode_receipt

IDLE_S = 60.0
"""A consumer without a call this long is dropped (its leases stay)."""
LINGER_S = 0.03
"""After the first messages, how long a call waits for more: over the due times one hand-out
spans (up to 20 ms, at a slow rate), so messages granted in the same step as the first are not
left behind."""


class UnaryConsumers:
    """The stream-less consumers of one leader's `Courier`. On the loop."""

    def __init__(self, courier: Courier, replica: Replica, clock_ms: Callable[[], int]) -> None:
        self._courier = courier
        self._replica = replica
        self._clock_ms = clock_ms
        self._consumers: dict[tuple[str, str, str], tuple[Session, asyncio.Lock]] = {}
        self._used_s: dict[tuple[str, str, str], float] = {}

    async def receive(self, topic: str, group: str, name: str, max_messages: int,
                      invisible_ms: int, wait_s: float) -> list[Sent]:
        """Up to ``max_messages`` messages, each under a durable lease of ``invisible_ms``;
        waits up to ``wait_s`` for the first. Raises `NotLeader` on a follower."""
        self._drop_idle()
        key = (topic, group, name)
        consumer, lock = await self._consumer(key, invisible_ms)
        async with lock:
            self._used_s[key] = time.monotonic()
            batch = self._waiting(consumer, max_messages)
            if batch:
                return batch
            consumer.credits = max(consumer.credits, 0)  # sends beyond its credits: a spill
            self._courier.grant(consumer, max_messages)
            try:
                try:
                    batch = await asyncio.wait_for(consumer.next_batch(), wait_s)
                except TimeoutError:
                    return []
                consumer.spill[:0] = batch
                if len(batch) < max_messages:
                    await asyncio.sleep(LINGER_S)
                return self._waiting(consumer, max_messages)
            finally:
                if consumer.credits > 0:
                    self._courier.grant(consumer, -consumer.credits)

    async def settle(self, topic: str, group: str, receipts: list[str],
                     invisible_ms: int | None) -> list[bool]:
        """Ack (``invisible_ms`` None) or move the deadline of each receipt's lease to
        ``invisible_ms`` from now; per receipt, whether it named a current lease of this
        group. Another group's receipt, or one never granted, changes nothing."""
        shard = self._replica.shard
        leases: list[LeaseRef | None] = [decode_receipt(r, f"receipts[{i}]", shard)
                                         for i, r in enumerate(receipts)]
        groups = self._replica.groups()
        for index, lease in enumerate(leases):
            found = groups.by_id(lease.group_id) if lease is not None else None
            if found is None or (found.topic, found.name) != (topic, group):
                leases[index] = None
        mine = [lease for lease in leases if lease is not None]
        taken: list[bool] = []
        if mine:
            if invisible_ms is None:
                future = self._replica.ack(mine)
            else:
                deadline_ms = self._clock_ms() + invisible_ms
                future = self._replica.extend(mine, [deadline_ms] * len(mine))
            taken = list(await committed(future))
        self._forget_sent(topic, group, receipts)
        answers = iter(taken)
        return [lease is not None and next(answers) for lease in leases]

    async def _consumer(self, key: tuple[str, str, str], invisible_ms: int
                        ) -> tuple[Session, asyncio.Lock]:
        held = self._consumers.get(key)
        if held is not None and held[0].closed is None and (
                held[0].visibility_timeout_ms == invisible_ms):
            return held
        if held is not None:
            self._courier.unsubscribe(held[0])
        topic, group, name = key
        consumer = await self._courier.subscribe(topic, group, name, 0, invisible_ms, DURABLE)
        held = self._consumers[key] = (consumer, asyncio.Lock())
        return held

    def _waiting(self, consumer: Session, max_messages: int) -> list[Sent]:
        """What the consumer's outbox already holds, at most ``max_messages`` and what one
        response carries (`tickwheel.node.delivery.batches.fitting`); the rest waits for the
        next call."""
        while not consumer.outbox.empty():
            batch = consumer.outbox.get_nowait()
            if batch is None:
                consumer.outbox.put_nowait(None)  # closed: the next call subscribes afresh
                break
            consumer.spill.extend(batch)
        count = fitting(consumer.spill, max_messages, self._courier.config.max_batch_bytes)
        taken, consumer.spill[:count] = consumer.spill[:count], []
        return taken

    def _forget_sent(self, topic: str, group: str, receipts: list[str]) -> None:
        """Settled receipts leave their consumer's unacked map (what a stream's acks read;
        a moved deadline is watched by the replica from now on)."""
        for (key_topic, key_group, _), (consumer, _) in self._consumers.items():
            if (key_topic, key_group) == (topic, group):
                for receipt in receipts:
                    consumer.unacked.pop(receipt, None)

    def _drop_idle(self) -> None:
        now_s = time.monotonic()
        for key in [k for k, used in self._used_s.items() if now_s - used > IDLE_S]:
            consumer, _ = self._consumers.pop(key)
            del self._used_s[key]
            self._courier.unsubscribe(consumer)
