"""Retry copies of messages a consumer did not settle: nacks, and visibility timeouts.

Each copy keeps the message's id, counts one more attempt, and is due after the retry ladder's
next step (`RetryPolicy`), for its group only; after the last attempt it goes to the group's
dead-letter topic (``%DLQ%<topic>`` for the default group, ``%DLQ%<group>`` for a named one).
The copy and the end of the lease are one replicated command (`Replica.retry`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from types import MappingProxyType

from tickwheel.common.errors import TickwheelError
from tickwheel.node.levels import DLQ_PREFIX, RetryPolicy
from tickwheel.node.metrics import Metrics
from tickwheel.replication import DEFAULT_GROUP, TARGET_GROUP_PROPERTY, LeaseRef, Replica, Retried
from tickwheel.wheel import DueMessage, NewMessage

log = logging.getLogger("tickwheel.delivery")

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
RetryItem = tuple[DueMessage, LeaseRef, str, int]
"""``(message, lease, group, attempt)``: one message to retry."""


class Retries:
    """On the courier's loop."""

    def __init__(self, policy: RetryPolicy, clock_ms: Callable[[], int], metrics: Metrics,
                 loop: asyncio.AbstractEventLoop, replica: Callable[[], Replica]) -> None:
        self._policy = policy
        self._clock_ms = clock_ms
        self._metrics = metrics
        self._loop = loop
        self._replica = replica

    def propose(self, items: list[RetryItem], reason: str, at_once: bool = False) -> None:
        """Propose a retry copy of each message for its group, after the retry ladder's next
        step (or, ``at_once``, now); the lease ends with it."""
        if not items:
            return
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
        except TickwheelError as error:
            log.warning("event=retry_failed messages=%d error=%r", len(items), error)
            return  # the lease stays: its deadline retries it, or the next leader does
        future.add_done_callback(lambda done: self._loop.call_soon_threadsafe(
            self._retried, items, copies, done, reason))

    def _retried(self, items: list[RetryItem],
                 copies: list[tuple[LeaseRef, NewMessage]], done: Future[list[Retried]],
                 reason: str) -> None:
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
