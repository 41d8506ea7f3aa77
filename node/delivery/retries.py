"""Retry copies of messages a consumer did not settle: nacks, and visibility timeouts.

Each copy keeps the message's id, counts one more attempt, and is due after the retry ladder's
next step (`RetryPolicy`), for its group only; after the last attempt it goes to the group's
dead-letter topic (``%DLQ%<topic>`` for the default group, ``%DLQ%<group>`` for a named one).
The copy and the end of the lease are one replicated command (`Replica.retry`).

Copies go to Raft at most `WINDOW_BYTES` of bodies at a time; the rest wait, holding nothing
more than the leases they end (the courier's messages). A consumer that reads and never
acknowledges has its whole budget run out at once, and each copy is held several times on
its way (encoded, in the Raft log, in every follower's frames): 128 MiB of copies proposed
together took the leader up by 530 MB.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from types import MappingProxyType

from tickwheel.common.errors import Overloaded, TickwheelError
from tickwheel.node.delivery.levels import DLQ_PREFIX, RetryPolicy
from tickwheel.node.ops.metrics import Metrics
from tickwheel.replication import DEFAULT_GROUP, TARGET_GROUP_PROPERTY, LeaseRef, Replica, Retried
from tickwheel.wheel import DueMessage, NewMessage

log = logging.getLogger("tickwheel.delivery")

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
RetryItem = tuple[DueMessage, LeaseRef, str, int]
"""``(message, lease, group, attempt)``: one message to retry."""
WINDOW_BYTES = 16 << 20
"""Bodies of retry copies proposed and not yet applied (a batch beyond it goes alone)."""
REFUSED_WAIT_S = 0.2
"""How long a batch the replica refused as `Overloaded` (its queue full) waits before it is
proposed again, with every batch behind it."""


class Retries:
    """On the courier's loop."""

    def __init__(self, policy: RetryPolicy, clock_ms: Callable[[], int], metrics: Metrics,
                 loop: asyncio.AbstractEventLoop, replica: Callable[[], Replica]) -> None:
        self._policy = policy
        self._clock_ms = clock_ms
        self._metrics = metrics
        self._loop = loop
        self._replica = replica
        self._waiting: deque[tuple[list[RetryItem], str, bool]] = deque()
        self._proposed_bytes = 0
        """Bodies of the copies proposed and not yet answered."""
        self._pause: asyncio.TimerHandle | None = None
        """Set while a refused batch waits to be proposed again."""

    def propose(self, items: list[RetryItem], reason: str, at_once: bool = False) -> None:
        """Propose a retry copy of each message for its group, after the retry ladder's next
        step (or, ``at_once``, now), in batches within `WINDOW_BYTES`; the lease ends with
        it."""
        batch: list[RetryItem] = []
        batch_bytes = 0
        for item in items:
            if batch and batch_bytes + len(item[0].body) > WINDOW_BYTES:
                self._waiting.append((batch, reason, at_once))
                batch, batch_bytes = [], 0
            batch.append(item)
            batch_bytes += len(item[0].body)
        if batch:
            self._waiting.append((batch, reason, at_once))
        self._next()

    def _next(self) -> None:
        """Propose waiting batches while the window has room (one at least, when empty). A
        batch the replica refuses as `Overloaded` waits `REFUSED_WAIT_S` at the head of the
        queue, and is proposed again: its leases have expired, and the planner offers an
        expired lease once, so a batch dropped here stayed unretried for as long as this
        node led."""
        while self._waiting and self._pause is None:
            batch, reason, at_once = self._waiting[0]
            batch_bytes = sum(len(message.body) for message, _, _, _ in batch)
            if self._proposed_bytes and self._proposed_bytes + batch_bytes > WINDOW_BYTES:
                return
            try:
                proposed = self._propose(batch, reason, at_once)
            except Overloaded as error:
                log.warning("event=retry_refused messages=%d error=%r wait_ms=%d", len(batch),
                            error, REFUSED_WAIT_S * 1000)
                self._pause = self._loop.call_later(REFUSED_WAIT_S, self._resume)
                return
            self._waiting.popleft()
            if proposed:
                self._proposed_bytes += batch_bytes

    def _resume(self) -> None:
        self._pause = None
        self._next()

    def _propose(self, items: list[RetryItem], reason: str, at_once: bool) -> bool:
        """Propose one batch; whether it was (not on a follower); raises `Overloaded` when
        the replica's queue is full."""
        now_ms = self._clock_ms()
        copies = []
        for message, lease, group, attempt in items:
            topic, delay_ms = self._policy.next_copy(message.topic, attempt)
            if at_once:
                delay_ms = 0
            properties = dict(message.properties)
            if topic == message.topic:
                properties[TARGET_GROUP_PROPERTY] = group
            else:
                properties.pop(TARGET_GROUP_PROPERTY, None)
                if group != DEFAULT_GROUP:
                    topic = DLQ_PREFIX + group
            copies.append((lease, NewMessage(message.id, topic, message.body, now_ms + delay_ms,
                                             properties or _NO_PROPERTIES, attempt + 1)))
        try:
            future = self._replica().retry(copies)
        except Overloaded:
            raise
        except TickwheelError as error:
            log.warning("event=retry_failed messages=%d error=%r", len(items), error)
            return False  # not leading: the lease stays, and the next leader retries it
        future.add_done_callback(lambda done: self._loop.call_soon_threadsafe(
            self._retried, items, copies, done, reason))
        return True

    def _retried(self, items: list[RetryItem],
                 copies: list[tuple[LeaseRef, NewMessage]], done: Future[list[Retried]],
                 reason: str) -> None:
        self._proposed_bytes -= sum(len(copy.body) for _, copy in copies)
        self._next()
        if done.exception() is not None:
            log.warning("event=retry_failed messages=%d error=%r", len(items),
                        done.exception())
            return
        for (message, _, group, attempt), (_, copy), result in zip(
                items, copies, done.result(), strict=True):
            if not isinstance(result, Retried) or result.handle is None:
                continue
            counter = (self._metrics.retried if copy.topic == message.topic
                       else self._metrics.dead_lettered)
            counter.labels(self._metrics.topic(message.topic)).inc()
            log.info("event=message_retried reason=%s id=%r topic=%s group=%r attempt=%d "
                     "to_topic=%s deliver_at_ms=%d handle=%s", reason, copy.id, message.topic,
                     group, attempt, copy.topic, copy.deliver_at_ms, result.handle)
