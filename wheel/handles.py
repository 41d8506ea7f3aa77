"""What a handle names, wherever it is: read it, cancel it, tombstone it.

A handle is ``hour << GLOBAL_INDEX_BITS | global_index``: the message's index unit in its hour
segment. `Handles` answers for any handle the segments still hold, ahead of the cursor or
behind it (the wheel keeps passed hours until a snapshot no longer names them); the
cursor, which it reads but never moves, decides what is still pending.
"""

from __future__ import annotations

from collections.abc import Callable

from tickwheel.common.errors import UnknownHandle
from tickwheel.wheel.chains import GLOBAL_INDEX_BITS, GLOBAL_INDEX_MASK
from tickwheel.wheel.format import SECONDS_PER_HOUR, TOMBSTONE
from tickwheel.wheel.hours import HourSet
from tickwheel.wheel.segment import HourSegment
from tickwheel.wheel.types import CancelResult, Cursor, DueMessage


class Handles:
    """Reads and tombstones by handle over ``hours``; ``cursor`` tells where the wheel stands."""

    def __init__(self, hours: HourSet, cursor: Callable[[], Cursor]) -> None:
        self._hours = hours
        self._cursor = cursor

    def cancel_tag(self, handle: int) -> tuple[CancelResult, int]:
        """Tombstone the message ``handle`` names, and say what that did (`CancelResult`),
        with the message's tag when this call cancelled it (else 0).

        A message already handed out by `Wheel.take_due` but not yet behind the cursor is
        still cancelled: it will not be handed out again. A tombstone is checked before the
        cursor, so a repeated cancel reads ``ALREADY_CANCELLED`` until the message's hour is
        deleted. Raises `UnknownHandle` for a handle never returned.
        """
        if handle < 0:
            raise UnknownHandle("handle", f"{handle} was never returned by schedule")
        hour, global_index = handle >> GLOBAL_INDEX_BITS, handle & GLOBAL_INDEX_MASK
        cursor = self._cursor()
        if (hour + 1) * SECONDS_PER_HOUR <= cursor.second:
            return CancelResult.NOT_PENDING, 0  # its hour is behind the cursor, and deleted
        segment = self._hours.segment(hour, create=False)
        if segment is None or global_index >= segment.units:
            raise UnknownHandle("handle", f"{handle} was never returned by schedule")
        if global_index in segment.tombstones:
            return CancelResult.ALREADY_CANCELLED, 0
        fields = segment.read_unit(global_index)
        if Cursor(hour * SECONDS_PER_HOUR + fields[6], fields[2]) < cursor:
            return CancelResult.NOT_PENDING, 0
        segment.add_tombstone(global_index, fields[6])
        self._hours.written(hour, TOMBSTONE.size)
        self._hours.tag_hours.cancelled(hour, fields[7])
        return CancelResult.CANCELLED, fields[7]

    def read(self, handle: int) -> tuple[DueMessage, bool]:
        """The message ``handle`` names, and whether it is cancelled (tombstoned). Raises
        `UnknownHandle` for a handle never returned or of an hour already deleted, and
        `CorruptSegment` for a record that fails its CRC."""
        segment, global_index = self._segment_of(handle)
        fields = segment.read_unit(global_index)
        offset, size, local_index = fields[:3]
        second = (handle >> GLOBAL_INDEX_BITS) * SECONDS_PER_HOUR + fields[6]
        decoded = segment.record(offset, size)
        message = DueMessage(*decoded[:5], handle, second, local_index, decoded[5])
        return message, global_index in segment.tombstones

    def is_cancelled(self, handle: int) -> bool:
        """Whether ``handle`` is tombstoned (False for an unknown handle)."""
        return bool(self.cancelled_among([handle]))

    def cancelled_among(self, handles: list[int]) -> set[int]:
        """Those of ``handles`` that are tombstoned: a look per hour, and none per handle of
        an hour without tombstones (the usual hour)."""
        cancelled: set[int] = set()
        for hour in {handle >> GLOBAL_INDEX_BITS for handle in handles}:
            segment = self._hours.segment(hour, create=False)
            if segment is not None and segment.tombstones:
                tombstones = segment.tombstones
                cancelled.update(h for h in handles if h >> GLOBAL_INDEX_BITS == hour
                                 and h & GLOBAL_INDEX_MASK in tombstones)
        return cancelled

    def tombstone(self, handle: int) -> int:
        """Tombstone ``handle`` wherever it is, behind the cursor too, and return its tag: a
        replicated state machine cancels messages that left the wheel for consumer groups
        this way, so that a repeated cancel reads ``ALREADY_CANCELLED``."""
        segment, global_index = self._segment_of(handle)
        fields = segment.read_unit(global_index)
        if global_index not in segment.tombstones:
            segment.add_tombstone(global_index, fields[6])
            self._hours.written(handle >> GLOBAL_INDEX_BITS, TOMBSTONE.size)
            self._hours.tag_hours.cancelled(handle >> GLOBAL_INDEX_BITS, fields[7])
        return int(fields[7])

    def is_behind(self, handle: int) -> bool:
        """Whether the whole hour of ``handle`` is behind the cursor."""
        return handle >= 0 and ((handle >> GLOBAL_INDEX_BITS) + 1) * SECONDS_PER_HOUR <= (
            self._cursor().second)

    def _segment_of(self, handle: int) -> tuple[HourSegment, int]:
        hour, global_index = handle >> GLOBAL_INDEX_BITS, handle & GLOBAL_INDEX_MASK
        segment = self._hours.segment(hour, create=False) if handle >= 0 else None
        if segment is None or global_index >= segment.units:
            raise UnknownHandle("handle", f"{handle} was never returned by schedule, or its "
                                "hour is gone")
        return segment, global_index
