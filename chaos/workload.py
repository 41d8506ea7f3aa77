"""What the harness does to the cluster as a user would, and what it writes down.

Producers schedule through the client library at a steady rate with mixed delays; a canceller
cancels some of what was accepted; consumers receive and acknowledge (some slowly, some
"crashing" before the acknowledgement); a monitor polls `ClusterInfo` and notes every leader
change. Each writes JSON lines (`EventLog`) whose fields the audit (`tickwheel.chaos.audit`)
documents. Every random choice comes from a `random.Random` seeded from the run's seed, so a
run's workload is reproducible (its timing, on a shared machine, is not).

Times are Unix milliseconds on the harness's real clock: the clock the audit judges by.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tickwheel.client import Client, Message, Received, TickwheelClientError

log = logging.getLogger("tickwheel.chaos")

TOPICS = ("orders", "reminders")
BODY = b"c" * 100
DAY_MS = 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class EventLog:
    """One JSON-lines file, written by many threads; every line is flushed at once, so a
    harness killed mid-run leaves complete lines behind."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (owned)
        self._lock = threading.Lock()
        self.lines = 0

    def write(self, event: dict) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()


@dataclass(frozen=True, slots=True)
class Mix:
    """How producers pick due times. Fractions of messages; ``near`` takes the rest."""

    due: float = 0.10
    """Already due when sent: up to ``overdue_max_ms`` in the past."""
    burst: float = 0.20
    """Groups of messages due in the same millisecond."""
    far: float = 0.05
    """Due days ahead: they must survive every fault, and are never due within the run."""
    near_max_ms: int = 60_000
    overdue_max_ms: int = 2_000
    burst_size: tuple[int, int] = (5, 20)


class Producer(threading.Thread):
    """Schedules ``rate`` messages a second in batches every ``tick_s``; notes each message
    with whether the cluster acknowledged it (``acked`` false: the call failed after the
    client's retries, and the outcome is unknown)."""

    def __init__(self, index: int, targets: list[str], rate: float, mix: Mix, seed: int,
                 scheduled: EventLog, accepted: deque, stop: threading.Event,
                 tick_s: float = 0.05) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self._index = index
        self._client = Client(targets, timeout_s=15, attempt_timeout_s=3)
        self._rate = rate
        self._mix = mix
        self._random = random.Random(seed)
        self._scheduled = scheduled
        self._accepted = accepted
        self._halt = stop
        self._tick_s = tick_s
        self._sequence = 0

    def run(self) -> None:
        tokens, last = 0.0, time.monotonic()
        while not self._halt.is_set():
            current = time.monotonic()
            # A token bucket holding at most a second's worth: after a stall (a failover),
            # the producer catches up one second, not the whole stall at once.
            tokens = min(self._rate, tokens + self._rate * (current - last))
            last = current
            if tokens >= 1:
                self._send(self._batch(int(tokens)))
                tokens -= int(tokens)
            else:
                self._halt.wait(self._tick_s)
        self._client.close()

    def _batch(self, count: int) -> list[tuple[Message, str]]:
        batch: list[tuple[Message, str]] = []
        while len(batch) < count:
            topic = self._random.choice(TOPICS)
            kind, due_ms, size = self._pick(now_ms())
            for _ in range(min(size, count - len(batch)) if kind == "burst" else 1):
                self._sequence += 1
                message_id = f"p{self._index}-{self._sequence}"
                batch.append((Message(topic, BODY, deliver_at_ms=due_ms, id=message_id), kind))
        return batch

    def _pick(self, sent_ms: int) -> tuple[str, int, int]:
        mix, draw = self._mix, self._random.random()
        if draw < mix.due:
            return "due", sent_ms - self._random.randrange(mix.overdue_max_ms), 1
        if draw < mix.due + mix.burst:
            return ("burst", sent_ms + self._random.randrange(1_000, 10_000),
                    self._random.randint(*mix.burst_size))
        if draw < mix.due + mix.burst + mix.far:
            return "far", sent_ms + self._random.randrange(DAY_MS, 30 * DAY_MS), 1
        return "near", sent_ms + self._random.randrange(mix.near_max_ms), 1

    def _send(self, batch: list[tuple[Message, str]]) -> None:
        sent_ms = now_ms()
        try:
            results = self._client.schedule_many(message for message, _ in batch)
        except TickwheelClientError as error:
            log.warning("event=schedule_failed producer=%d messages=%d error=%s", self._index,
                        len(batch), error)
            results = None
        acked_ms = now_ms() if results is not None else None
        for position, (message, kind) in enumerate(batch):
            handle = results[position].handle if results is not None else None
            self._scheduled.write({
                "id": message.id, "topic": message.topic,
                "deliver_at_ms": message.deliver_at_ms, "sent_ms": sent_ms,
                "acked": results is not None, "acked_ms": acked_ms, "handle": handle,
                "kind": kind})
            if handle is not None:
                self._accepted.append((message.id, handle, message.deliver_at_ms))


class Canceller(threading.Thread):
    """Cancels a ``fraction`` of accepted messages, chosen among those due at least
    ``min_ahead_ms`` later (so a cancel is not a race with delivery)."""

    def __init__(self, targets: list[str], fraction: float, seed: int, cancels: EventLog,
                 accepted: deque, stop: threading.Event, min_ahead_ms: int = 5_000) -> None:
        super().__init__(name="canceller", daemon=True)
        self._client = Client(targets, timeout_s=15, attempt_timeout_s=3)
        self._fraction = fraction
        self._random = random.Random(seed)
        self._cancels = cancels
        self._accepted = accepted
        self._halt = stop
        self._min_ahead_ms = min_ahead_ms

    def run(self) -> None:
        while not self._halt.wait(0.2):
            chosen = []
            while self._accepted:
                message_id, handle, due_ms = self._accepted.popleft()
                if (due_ms > now_ms() + self._min_ahead_ms
                        and self._random.random() < self._fraction):
                    chosen.append((message_id, handle))
            if chosen:
                self._cancel(chosen)
        self._client.close()

    def _cancel(self, chosen: list[tuple[str, int]]) -> None:
        sent_ms = now_ms()
        try:
            outcomes = [outcome.value
                        for outcome in self._client.cancel_outcomes([h for _, h in chosen])]
        except TickwheelClientError as error:
            log.warning("event=cancel_failed messages=%d error=%s", len(chosen), error)
            outcomes = ["unknown"] * len(chosen)
        done_ms = now_ms()
        for (message_id, handle), outcome in zip(chosen, outcomes, strict=True):
            self._cancels.write({"id": message_id, "handle": handle, "sent_ms": sent_ms,
                                 "done_ms": done_ms, "outcome": outcome})


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


CONSUMERS = (Behaviour("steady"), Behaviour("slow", ack_delay_s=(0.02, 0.15)),
             Behaviour("crashy", crash_probability=0.01))


class ConsumerWorker(threading.Thread):
    """One consumer of ``topic`` with a `Behaviour`; notes every message it receives."""

    def __init__(self, targets: list[str], topic: str, behaviour: Behaviour, seed: int,
                 names: dict[str, str], received: EventLog, stop: threading.Event) -> None:
        super().__init__(name=f"consumer-{topic}-{behaviour.name}", daemon=True)
        self._client = Client(targets, timeout_s=30, attempt_timeout_s=3)
        self._topic = topic
        self._behaviour = behaviour
        self._random = random.Random(seed)
        self._names = names
        self._received = received
        self._halt = stop
        self._consumer = None
        self.crashes = 0

    def run(self) -> None:
        while not self._halt.is_set():
            self._consumer = self._client.consume(
                self._topic, prefetch=32, name=self.name,
                visibility_timeout_ms=self._behaviour.visibility_timeout_ms)
            crashed = self._consume()
            self._consumer.close(timeout_s=1)
            if crashed:
                self.crashes += 1
                self._halt.wait(self._behaviour.restart_s)
        self._client.close()

    def close(self) -> None:
        """Stop from another thread: end the stream the worker is reading."""
        if self._consumer is not None:
            self._consumer.close(timeout_s=1)

    def _consume(self) -> bool:
        """Read until stopped (False) or until this consumer "crashes" (True)."""
        behaviour = self._behaviour
        for message in self._consumer:
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

    def _note(self, message: Received, *, acked: bool) -> None:
        self._received.write({
            "id": message.id, "topic": message.topic, "deliver_at_ms": message.deliver_at_ms,
            "delivered_at_ms": message.delivered_at_ms, "received_ms": now_ms(),
            "attempt": message.attempt, "possible_duplicate": message.possible_duplicate,
            "node": self._names.get(message.node, message.node), "consumer": self.name,
            "acked": acked})


class LeaderMonitor(threading.Thread):
    """Polls every node's `ClusterInfo` every ``poll_s`` and writes a line whenever the
    leader it sees changes: the node that says it leads, in the highest term heard."""

    def __init__(self, nodes: dict[str, str], leaders: EventLog, stop: threading.Event,
                 poll_s: float = 0.1) -> None:
        super().__init__(name="leader-monitor", daemon=True)
        self._nodes = nodes
        self._client = Client(list(nodes.values()), timeout_s=1, attempt_timeout_s=0.3)
        self._leaders = leaders
        self._halt = stop
        self._poll_s = poll_s
        self.current: tuple[str | None, int] = (None, 0)
        self.changes = 0

    def run(self) -> None:
        while not self._halt.wait(self._poll_s):
            seen = self.poll()
            if seen[0] != self.current[0]:
                self.current = seen
                self.changes += 1
                self._leaders.write({"at_ms": now_ms(), "leader": seen[0], "term": seen[1]})
        self._client.close()

    def poll(self) -> tuple[str | None, int]:
        """The node that says it leads and that most answering nodes name as leader (a paused
        leader, resumed, can answer "leader" in its successor's term for a moment: the term is
        updated before the role); ``(None, 0)`` without a majority of answering nodes."""
        infos = {}
        for name, address in self._nodes.items():
            try:
                infos[name] = self._client.cluster_info(address)
            except TickwheelClientError:
                continue
        best: tuple[str | None, int] = (None, 0)
        best_key = (0, 0)
        for name, info in infos.items():
            if info.role != "leader":
                continue
            named_by = sum(other.leader_grpc == self._nodes[name] for other in infos.values())
            if named_by * 2 > len(infos) and (info.term, named_by) > best_key:
                best, best_key = (name, info.term), (info.term, named_by)
        return best
