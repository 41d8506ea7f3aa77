"""Cancels and reschedules, as the workload sends them: a canceller cancels some accepted
messages well ahead of their due time, and hands others to a racer, which cancels or
reschedules them a few milliseconds before they are due. Every answer is written down for the
audit (``cancels.jsonl``, ``reschedules.jsonl``)."""

from __future__ import annotations

import heapq
import logging
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tickwheel.chaos.events import CancelEvent, EventLog, RescheduleEvent
from tickwheel.chaos.workload import GROUPS, Accepted, Endpoint, now_ms
from tickwheel.client import Client, TickwheelClientError

log = logging.getLogger("tickwheel.chaos")


class Canceller(threading.Thread):
    """Cancels a ``fraction`` of accepted messages, chosen among those due at least
    ``min_ahead_ms`` later (so a cancel is not a race with delivery), and hands a
    ``race_fraction`` of the consumed topics' messages to the `Racer`."""

    def __init__(self, cluster: Endpoint, fraction: float, seed: int,
                 cancels: EventLog[CancelEvent], accepted: deque[Accepted],
                 stop: threading.Event, racer: Racer | None = None,
                 race_fraction: float = 0.0, min_ahead_ms: int = 5_000) -> None:
        super().__init__(name="canceller", daemon=True)
        self._client = cluster.client(timeout_s=15, attempt_timeout_s=3)
        self._fraction = fraction
        self._random = random.Random(seed)
        self._cancels = cancels
        self._accepted = accepted
        self._halt = stop
        self._racer = racer
        self._race_fraction = race_fraction
        self._min_ahead_ms = min_ahead_ms

    def run(self) -> None:
        while not self._halt.wait(0.2):
            chosen = []
            while self._accepted:
                message_id, topic, handle, due_ms = self._accepted.popleft()
                draw = self._random.random()
                if draw < self._fraction and due_ms > now_ms() + self._min_ahead_ms:
                    chosen.append((message_id, handle, due_ms))
                elif (self._racer is not None and topic in GROUPS
                      and draw > 1 - self._race_fraction):
                    self._racer.add(message_id, handle, due_ms)
            if chosen:
                write_cancels(self._client, chosen, self._cancels, raced=False)
        self._client.close()


def timed(call: Callable[[], list[str]], count: int, what: str) -> tuple[int, int, list[str]]:
    """``(sent_ms, done_ms, outcomes)`` of a call about ``count`` messages; every outcome is
    ``unknown`` when it failed after the client's retries."""
    sent_ms = now_ms()
    try:
        outcomes = call()
    except TickwheelClientError as error:
        log.warning("event=%s_failed messages=%d error=%s", what, count, error)
        outcomes = ["unknown"] * count
    return sent_ms, now_ms(), outcomes


def write_cancels(client: Client, chosen: list[tuple[str, int, int]],
                  cancels: EventLog[CancelEvent], *,
                  raced: bool) -> None:
    """Cancel ``(id, handle, due_ms)``s in one call and log each answer."""
    handles = [handle for _, handle, _ in chosen]
    sent_ms, done_ms, outcomes = timed(
        lambda: [outcome.value for outcome in client.cancel_outcomes(handles)],
        len(chosen), "cancel")
    for (message_id, handle, due_ms), outcome in zip(chosen, outcomes, strict=True):
        cancels.write({"id": message_id, "handle": handle, "sent_ms": sent_ms,
                       "done_ms": done_ms, "outcome": outcome, "deliver_at_ms": due_ms,
                       "raced": raced})


@dataclass(frozen=True, slots=True)
class Race:
    """What the `Racer` does to the messages handed to it, and when."""

    lead_ms: tuple[int, int] = (0, 100)
    """How long before its due time a message's call is sent, drawn uniformly (the leader
    hands out 20-30 ms ahead of due, so both answers happen)."""
    cancel: float = 0.5
    """The share cancelled; the rest is rescheduled."""
    to_now: float = 0.3
    """Of the rescheduled, the share moved to now; the others move 1-5 s later."""
    later_ms: tuple[int, int] = (1_000, 5_000)


class Racer(threading.Thread):
    """Cancels or reschedules messages a few milliseconds before they are due: the race that
    "a cancel means never" and "a rescheduled message comes at its new time only" must survive.
    Every message whose moment has come goes out in one call per kind (singly or in batches,
    as they fall), each answer logged with when it was sent and returned."""

    def __init__(self, cluster: Endpoint, seed: int, cancels: EventLog[CancelEvent],
                 reschedules: EventLog[RescheduleEvent], stop: threading.Event,
                 race: Race = Race()) -> None:
        super().__init__(name="racer", daemon=True)
        self._client = cluster.client(timeout_s=15, attempt_timeout_s=3)
        self._random = random.Random(seed)
        self._cancels = cancels
        self._reschedules = reschedules
        self._halt = stop
        self._race = race
        self._heap: list[tuple[int, str, int, int, str]] = []
        self._wake = threading.Condition()
        self._batches = 0

    def add(self, message_id: str, handle: int, due_ms: int) -> None:
        race, draw = self._race, self._random.random()
        action = ("cancel" if draw < race.cancel
                  else "now" if draw < race.cancel + (1 - race.cancel) * race.to_now
                  else "later")
        at_ms = due_ms - self._random.randint(*race.lead_ms)
        with self._wake:
            heapq.heappush(self._heap, (at_ms, message_id, handle, due_ms, action))
            self._wake.notify()

    def run(self) -> None:
        while not self._halt.is_set():
            with self._wake:
                wait_s = (self._heap[0][0] - now_ms()) / 1000 if self._heap else 0.1
                if wait_s > 0:
                    self._wake.wait(min(wait_s, 0.1))
                    continue
                current, ready = now_ms(), []
                while self._heap and self._heap[0][0] <= current:
                    ready.append(heapq.heappop(self._heap))
            self._race_now(ready)
        self._client.close()

    def _race_now(self, ready: list[tuple[int, str, int, int, str]]) -> None:
        by_action: dict[str, list[tuple[str, int, int]]] = {}
        for _, message_id, handle, due_ms, action in ready:
            by_action.setdefault(action, []).append((message_id, handle, due_ms))
        if "cancel" in by_action:
            write_cancels(self._client, by_action["cancel"], self._cancels, raced=True)
        for action in ("now", "later"):
            if action in by_action:
                shift_ms = 0 if action == "now" else self._random.randint(*self._race.later_ms)
                self._reschedule(by_action[action], now_ms() + shift_ms)

    def _reschedule(self, chosen: list[tuple[str, int, int]], deliver_at_ms: int) -> None:
        self._batches += 1
        handles = [handle for _, handle, _ in chosen]
        sent_ms, done_ms, outcomes = timed(
            lambda: [result.outcome.value for result in self._client.reschedule(
                handles, deliver_at_ms=deliver_at_ms)], len(chosen), "reschedule")
        for (message_id, handle, due_ms), outcome in zip(chosen, outcomes, strict=True):
            self._reschedules.write({
                "id": message_id, "handle": handle, "sent_ms": sent_ms, "done_ms": done_ms,
                "outcome": outcome, "deliver_at_ms": deliver_at_ms, "old_deliver_at_ms": due_ms,
                "batch": self._batches, "size": len(chosen)})
