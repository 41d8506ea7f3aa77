"""The values that cross the wheel's boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType
from typing import Final, NamedTuple

DAY_MS: Final = 86_400_000
_NO_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType({})


class Cursor(NamedTuple):
    """Dispatch progress: every message before ``(second, local_index)`` is done.

    Messages are ordered by ``(slot second, local_index)``; ``local_index`` counts the messages
    filed under a second in arrival order. Tuples compare in that order.
    """

    second: int
    local_index: int


class CancelResult(IntEnum):
    """What cancelling a handle did. Cancelling is idempotent: a repeated cancel (a client
    retrying one whose answer was lost in a leader change) reads ``ALREADY_CANCELLED``, never
    ``NOT_PENDING``, so the caller learns the truth either way."""

    CANCELLED = 1
    """It was pending; it is now tombstoned and will not be handed out (again)."""
    ALREADY_CANCELLED = 2
    """An earlier cancel tombstoned it."""
    NOT_PENDING = 3
    """It is done: delivered and acknowledged by every group, or its whole hour is behind the
    cursor (and deleted, so whether it was delivered or cancelled is no longer known)."""
    HANDED_OUT = 4
    """Too late: a consumer group had it already (a lease on it was granted before the cancel
    in the log). Groups that had not got it never will."""

    @property
    def cancelled(self) -> bool:
        """Whether the message is cancelled, by this call or an earlier one."""
        return self in (CancelResult.CANCELLED, CancelResult.ALREADY_CANCELLED)


class NewMessage(NamedTuple):
    """A message to schedule. ``id`` is the client's; ``deliver_at_ms`` is Unix time in ms;
    ``attempt`` is 1 for a message a producer scheduled and counts up on each retry copy.

    The field order is `tickwheel.wheel.format.encode_record`'s argument order.
    """

    id: str
    topic: str
    body: bytes
    deliver_at_ms: int
    properties: Mapping[str, str] = _NO_PROPERTIES
    attempt: int = 1


class DueMessage(NamedTuple):
    """A message the wheel hands out for delivery.

    ``slot_second`` is the second it was filed under: its due second, or a later one when it
    arrived already overdue (see `Wheel.schedule`). ``position`` is its place in dispatch order,
    the cursor to pass once it is done.
    """

    id: str
    topic: str
    body: bytes
    properties: Mapping[str, str]
    deliver_at_ms: int
    handle: int
    slot_second: int
    local_index: int
    attempt: int = 1
    """The stored attempt: 1, or the number of this retry copy (see `NewMessage`)."""

    @property
    def position(self) -> Cursor:
        return Cursor(self.slot_second, self.local_index)


@dataclass(frozen=True, slots=True)
class WheelConfig:
    """Every limit of the engine, in one place, with its unit in its name."""

    preload_ms: int = 10_000
    """How far ahead of the dispatch clock index units are loaded into memory."""
    max_window_msgs: int = 100_000
    """Loading stops at this many units in memory (a second read whole, which holds at most
    ``max_load_units``, may pass it by its size)."""
    max_load_units: int = 10_000
    """Index units a take reads from chains at most: a second that holds more (a million
    messages due at once) is read as a walk, a take's share at a time as the dispatch takes
    it. Read in one go, it held the thread that also sends Raft's heartbeats for seconds, long
    enough for an election, and every new leader loaded it again."""
    max_open_hours: int = 1_024
    """Hour segments kept open (28.9 KiB of heads each); the least recently used closes."""
    max_buffered_bytes: int = 16 * 1024 * 1024
    """Appends buffered in memory before they are written to the segment files."""
    max_delay_ms: int = 366 * DAY_MS
    """The furthest ahead of the time stamp a message may be due."""

    def __post_init__(self) -> None:
        for name in ("preload_ms", "max_window_msgs", "max_load_units", "max_open_hours",
                     "max_buffered_bytes", "max_delay_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"WheelConfig.{name} must be positive, got {getattr(self, name)}")
