"""The runner's event logs: one JSON-lines file per kind of event, one `TypedDict` per kind.

The runner's threads write them (`EventLog`, flushed line by line; a burst's process through
the runner, thousands of lines at a time, `tickwheel.chaos.burst`) and the audit
(`tickwheel.chaos.audit`) reads them back with Spark; the audit's docstring says what each
field means. Times are Unix milliseconds on the runner's clock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Generic, Protocol, TextIO, TypedDict, TypeVar


class ScheduledEvent(TypedDict):
    """A line of ``scheduled.jsonl``: one message a producer sent (``acked`` false: the call
    failed after the client's retries, its outcome unknown; ``handle`` and ``acked_ms`` None)."""

    id: str
    topic: str
    deliver_at_ms: int
    sent_ms: int
    acked: bool
    acked_ms: int | None
    handle: int | None
    kind: str
    shard: int
    """The shard its id belongs to, where the client library sends it."""


class CancelEvent(TypedDict):
    """A line of ``cancels.jsonl``: one cancel and its outcome (a `CancelOutcome` value)."""

    id: str
    handle: int
    sent_ms: int
    done_ms: int
    outcome: str
    deliver_at_ms: int
    raced: bool


class RescheduleEvent(TypedDict):
    """A line of ``reschedules.jsonl``: one move of a batch, and its outcome."""

    id: str
    handle: int
    sent_ms: int
    done_ms: int
    outcome: str
    deliver_at_ms: int
    old_deliver_at_ms: int
    batch: int
    size: int


class ReceivedEvent(TypedDict):
    """A line of ``received.jsonl``: one delivery a consumer received."""

    id: str
    topic: str
    group: str
    deliver_at_ms: int
    delivered_at_ms: int
    received_ms: int
    attempt: int
    possible_duplicate: bool
    node: str
    consumer: str
    acked: bool


class LeaderEvent(TypedDict):
    """A line of ``leaders.jsonl``: the leader of ``shard`` the monitor sees changed (None: no
    leader)."""

    at_ms: int
    leader: str | None
    term: int
    shard: int


class FaultEvent(TypedDict):
    """A line of ``faults.jsonl``: a fault inflicted on ``node`` (None: every node) of
    ``shard``."""

    fault: str
    node: str | None
    shard: int
    started_ms: int
    ended_ms: int
    detail: str


Event = TypeVar("Event", bound=Mapping[str, object])
Written_contra = TypeVar("Written_contra", bound=Mapping[str, object], contravariant=True)


class EventWriter(Protocol[Written_contra]):
    """Where a worker writes its events: an `EventLog`, or a sink that passes them on to the
    runner's logs from another process (`tickwheel.chaos.burst`)."""

    def write(self, event: Written_contra) -> None: ...


class EventLog(Generic[Event]):
    """One JSON-lines file, written by many threads; every line is flushed at once, so a
    runner killed mid-run leaves complete lines behind."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (owned)
        self._lock = threading.Lock()
        self.lines = 0

    def write(self, event: Event) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.lines += 1

    def write_many(self, events: list[Event]) -> None:
        """Several events, flushed once (a burst's thousands of lines at a time)."""
        text = "".join(json.dumps(event, separators=(",", ":")) + "\n" for event in events)
        with self._lock:
            self._file.write(text)
            self._file.flush()
            self.lines += len(events)

    def close(self) -> None:
        with self._lock:
            self._file.close()
