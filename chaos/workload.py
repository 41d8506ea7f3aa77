"""What the runner does to the cluster as a user would, and what it writes down.

Producers schedule through the client library at a steady rate with mixed delays, on two
consumed topics and one nobody reads (`IDLE_TOPIC`); a canceller cancels some of what was
accepted well ahead of its due time and hands others to a racer, which cancels or reschedules
them a few milliseconds before they are due (`tickwheel.chaos.races`); consumers in two groups
of one topic and the default group of another receive and acknowledge (some slowly, some
"crashing" before the acknowledgement, one receiving without a stream:
`tickwheel.chaos.consumers`); a monitor polls `ClusterInfo` and notes every leader change. Each
writes JSON lines (`tickwheel.chaos.events`) whose fields the audit (`tickwheel.chaos.audit`)
documents. Every random choice comes from a `random.Random` seeded from the run's seed, so a
run's workload is reproducible (its timing, on a shared machine, is not).

Times are Unix milliseconds on the runner's real clock: the clock the audit judges by.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

from tickwheel.chaos.events import EventLog, LeaderEvent, ScheduledEvent
from tickwheel.client import (
    Client,
    Credentials,
    Message,
    TickwheelClientError,
)
from tickwheel.client.shards import shard_of

log = logging.getLogger("tickwheel.chaos")

GROUPS: dict[str, tuple[str, ...]] = {"orders": ("billing", "shipping"), "reminders": ("",)}
"""The consumed topics and their consumer groups ("": the topic's default group); every group
is owed every message of its topic."""
IDLE_TOPIC = "idle"
"""Written to, never read: its due messages wait in its default group and must hold nothing
else back."""
TOPIC_WEIGHTS = {"orders": 0.45, "reminders": 0.45, IDLE_TOPIC: 0.10}
BODY = b"c" * 100
DAY_MS = 86_400_000

Accepted = tuple[str, str, int, int]
"""A message the cluster acknowledged: ``(id, topic, handle, deliver_at_ms)``; the producers
append them, the canceller takes them."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Endpoint:
    """The cluster's gRPC addresses, and the credentials the workload calls with."""

    targets: list[str]
    credentials: Credentials

    def client(self, timeout_s: float, attempt_timeout_s: float) -> Client:
        return Client(self.targets, timeout_s=timeout_s, attempt_timeout_s=attempt_timeout_s,
                      credentials=self.credentials)


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

    def __init__(self, index: int, cluster: Endpoint, rate: float, mix: Mix, seed: int,
                 scheduled: EventLog[ScheduledEvent], accepted: deque[Accepted],
                 stop: threading.Event, tick_s: float = 0.05, shards: int = 1) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self._index = index
        self._client = cluster.client(timeout_s=15, attempt_timeout_s=3)
        self._rate = rate
        self._mix = mix
        self._random = random.Random(seed)
        self._scheduled = scheduled
        self._accepted = accepted
        self._halt = stop
        self._tick_s = tick_s
        self._shards = shards
        self._sequence = 0
        self._topics, self._weights = list(TOPIC_WEIGHTS), list(TOPIC_WEIGHTS.values())

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

    def _batch(self, count: int) -> list[tuple[Message, str, int]]:
        """``count`` messages to send, each with its kind (`_pick`) and due time."""
        batch: list[tuple[Message, str, int]] = []
        while len(batch) < count:
            topic = self._random.choices(self._topics, self._weights)[0]
            kind, due_ms, size = self._pick(now_ms())
            for _ in range(min(size, count - len(batch)) if kind == "burst" else 1):
                self._sequence += 1
                message_id = f"p{self._index}-{self._sequence}"
                message = Message(topic, BODY, deliver_at_ms=due_ms, id=message_id)
                batch.append((message, kind, due_ms))
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

    def _send(self, batch: list[tuple[Message, str, int]]) -> None:
        sent_ms = now_ms()
        try:
            results = self._client.schedule_many(message for message, _, _ in batch)
        except TickwheelClientError as error:
            log.warning("event=schedule_failed producer=%d messages=%d error=%s", self._index,
                        len(batch), error)
            results = None
        acked_ms = now_ms() if results is not None else None
        for position, (message, kind, due_ms) in enumerate(batch):
            handle = results[position].handle if results is not None else None
            self._scheduled.write({
                "id": message.id, "topic": message.topic,
                "deliver_at_ms": due_ms, "sent_ms": sent_ms,
                "acked": results is not None, "acked_ms": acked_ms, "handle": handle,
                "kind": kind, "shard": shard_of(message.id, self._shards)})
            if handle is not None:
                self._accepted.append((message.id, message.topic, handle, due_ms))


class LeaderMonitor(threading.Thread):
    """Polls the `ClusterInfo` of every node of ``shard`` every ``poll_s`` and writes a line
    whenever the leader it sees changes: the node that says it leads, in the highest term
    heard."""

    def __init__(self, nodes: dict[str, str], credentials: Credentials,
                 leaders: EventLog[LeaderEvent], stop: threading.Event,
                 poll_s: float = 0.1, shard: int = 0) -> None:
        super().__init__(name=f"leader-monitor-{shard}", daemon=True)
        self._shard = shard
        self._nodes = nodes
        self._client = Client(list(nodes.values()), timeout_s=1, attempt_timeout_s=0.3,
                              credentials=credentials)
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
                self._leaders.write({"at_ms": now_ms(), "leader": seen[0], "term": seen[1],
                                     "shard": self._shard})
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
