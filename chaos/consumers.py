"""The workload's consumers: two groups of one topic and the default group of another, each
with a steady consumer beside slow, "crashing" and stream-less ones. Every message received is
written down for the audit (``received.jsonl``)."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass

from tickwheel.chaos.events import EventWriter, ReceivedEvent
from tickwheel.chaos.workload import Endpoint, now_ms
from tickwheel.client import Consumer, Received, TickwheelClientError

log = logging.getLogger("tickwheel.chaos")


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How one consumer treats what it receives."""

    name: str
    ack_delay_s: tuple[float, float] = (0.0, 0.0)
    """Handling time before the acknowledgement, drawn uniformly."""
    crash_probability: float = 0.0
    """Per message: drop it unacknowledged, close the stream, come back after ``restart_s``."""
    restart_s: float = 1.0
    visibility_timeout_ms: int = 5_000
    prefetch: int = 32
    """Messages a stream may have on their way at once."""
    unary: bool = False
    """Receive without a stream (`Client.receive`: a batch per call, each message under a
    durable lease); a "crash" leaves the message's lease to run out."""


STEADY = Behaviour("steady")
SLOW = Behaviour("slow", ack_delay_s=(0.02, 0.15))
CRASHY = Behaviour("crashy", crash_probability=0.01)
RECEIVER = Behaviour("receiver", crash_probability=0.01, unary=True)
SUBSCRIPTIONS: tuple[tuple[str, str, Behaviour], ...] = (
    ("orders", "billing", STEADY), ("orders", "billing", SLOW),
    ("orders", "shipping", STEADY), ("orders", "shipping", CRASHY),
    ("orders", "shipping", RECEIVER),
    ("reminders", "", STEADY), ("reminders", "", SLOW), ("reminders", "", CRASHY))
"""``(topic, group, behaviour)`` of every consumer. Each group has a steady one: without it,
a group of a crashy consumer (down a second after every crash) and a receiver fell 2 s behind
(lateness p50 1.9 s in a 10-minute run), which measures the workload, not the service."""


class ConsumerWorker(threading.Thread):
    """One consumer of ``group`` of ``topic`` with a `Behaviour`; notes every message it
    receives."""

    def __init__(self, cluster: Endpoint, topic: str, group: str, behaviour: Behaviour,
                 seed: int, names: dict[str, str], received: EventWriter[ReceivedEvent],
                 stop: threading.Event) -> None:
        super().__init__(name=f"consumer-{topic}-{group or 'default'}-{behaviour.name}",
                         daemon=True)
        self._client = cluster.client(timeout_s=30, attempt_timeout_s=3)
        self._topic = topic
        self._group = group
        self._behaviour = behaviour
        self._random = random.Random(seed)
        self._names = names
        self._received = received
        self._halt = stop
        self._consumer: Consumer | None = None
        self.crashes = 0

    def run(self) -> None:
        if self._behaviour.unary:
            self._receive_unary()
        else:
            self._receive_streams()
        self._client.close()

    def close(self) -> None:
        """Stop from another thread: end the stream the worker is reading."""
        if self._consumer is not None:
            self._consumer.close(timeout_s=1)

    def _receive_streams(self) -> None:
        """A stream at a time until stopped; after a "crash", a new one ``restart_s`` later."""
        while not self._halt.is_set():
            self._consumer = consumer = self._client.consume(
                self._topic, prefetch=self._behaviour.prefetch, name=self.name,
                group=self._group,
                visibility_timeout_ms=self._behaviour.visibility_timeout_ms)
            crashed = self._consume(consumer)
            consumer.close(timeout_s=1)
            if crashed:
                self.crashes += 1
                self._halt.wait(self._behaviour.restart_s)

    def _consume(self, consumer: Consumer) -> bool:
        """Read until stopped (False) or until this consumer "crashes" (True)."""
        behaviour = self._behaviour
        for message in consumer:
            crash = self._random.random() < behaviour.crash_probability
            if not crash and behaviour.ack_delay_s[1] > 0:
                time.sleep(self._random.uniform(*behaviour.ack_delay_s))
            self._note(message, acked=not crash)
            if crash:
                return True
            message.ack()
            if self._halt.is_set():
                return False
        return False

    def _receive_unary(self) -> None:
        """Receive by calls until stopped; a failed call (no leader yet) is tried again."""
        behaviour = self._behaviour
        while not self._halt.is_set():
            try:
                batch = self._client.receive(
                    self._topic, consumer=self.name, group=self._group, max_messages=16,
                    invisible_duration_ms=behaviour.visibility_timeout_ms, wait_ms=1_000)
            except TickwheelClientError as error:
                log.info("event=receive_failed consumer=%s error=%s", self.name, error)
                self._halt.wait(0.2)
                continue
            for message in batch:
                crash = self._random.random() < behaviour.crash_probability
                self._note(message, acked=not crash)
                if crash:
                    self.crashes += 1
                    continue
                try:
                    message.ack()
                except TickwheelClientError as error:
                    log.info("event=ack_failed consumer=%s error=%s", self.name, error)

    def _note(self, message: Received, *, acked: bool) -> None:
        self._received.write({
            "id": message.id, "topic": message.topic, "group": message.group,
            "deliver_at_ms": message.deliver_at_ms,
            "delivered_at_ms": message.delivered_at_ms, "received_ms": now_ms(),
            "attempt": message.attempt, "possible_duplicate": message.possible_duplicate,
            "node": self._names.get(message.node, message.node), "consumer": self.name,
            "acked": acked})
