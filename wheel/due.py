"""How many messages are due in each bucket of time ahead: the due-time histogram.

Answered from counts the wheel keeps anyway, never from a walk of its chains: each hour's
heads hold how many messages were filed under each of its seconds, and each open segment how
many of those were cancelled since (`HourSegment.cancelled`, kept as tombstones are added).
An hour that lies whole inside one bucket is counted from its sizes alone: an open one from
``units`` less its tombstones, a closed one from its files' sizes (index units less
tombstones: two ``stat`` calls). Only an hour cut by a bucket's edge, the cursor or the
histogram's start is read second by second: from memory if it is open, else its heads file
(28.8 KiB) and the units its tombstones name. So the cost is O(hours holding messages after
the cursor) plus 3,600 additions for each hour cut, whatever the number of messages.

Exact for every message filed at or after the cursor's second and not cancelled, with one
exception: a message the leader has handed to its groups is counted until the cursor passes
its second (within about a second of being handed out). A message rescheduled is counted at
its new second alone (its old unit is tombstoned).

Any thread may call `due_histogram`: it reads open segments' counts (array elements, each
read atomic) and the files of the others, which the wheel's owner writes only while they are
open and flushes before it closes them. A count read while the owner files or cancels is
that moment's or the next one's. Called by `Wheel.due_histogram` (the node's
``DueHistogram`` call, through the replica).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from tickwheel.wheel.fileio import HEADS, INDEX, TOMBSTONES, file_size, pread_file, read_file
from tickwheel.wheel.format import (
    HEAD,
    SECONDS_PER_HOUR,
    TOMBSTONE,
    UNIT,
    UNIT_SIZE,
    unpack_heads,
    unpack_tombstones,
)
from tickwheel.wheel.hours import HourSet

_SECOND_FIELD = 6
"""The unit's ``second_of_hour`` (`tickwheel.wheel.format.UNIT`)."""
_HEADS_READS = 3
"""Reads of a closed hour's heads file before giving up on a torn one (it is rewritten in
place only while the hour is open; an hour reopened meanwhile is read from memory next)."""


@dataclass(frozen=True, slots=True)
class DueHistogram:
    """Live (not cancelled) messages by the second they are filed under."""

    start_second: int
    """Where the first bucket begins (Unix seconds)."""
    bucket_seconds: int
    counts: tuple[int, ...]
    """Bucket ``i`` covers ``[start_second + i * bucket_seconds, ... + bucket_seconds)``."""
    overdue: int
    """Filed from the cursor's second up to ``start_second``: due, not yet passed."""
    beyond: int
    """Filed at or after the end of the last bucket."""


def due_histogram(hours: HourSet, cursor_second: int, start_second: int, bucket_seconds: int,
                  buckets: int) -> DueHistogram:
    """Count the live messages filed from ``cursor_second`` on into ``buckets`` buckets of
    ``bucket_seconds`` from ``start_second`` (and those before and after them); a bucket
    before the cursor counts nothing."""
    first_second = cursor_second  # every message filed before it is done
    end_second = start_second + bucket_seconds * buckets
    counts = [0] * (buckets + 2)  # [overdue, bucket 0, ..., bucket n - 1, beyond]

    def region(second: int) -> int:
        if second < start_second:
            return 0
        if second >= end_second:
            return buckets + 1
        return 1 + (second - start_second) // bucket_seconds

    listed = list(hours.hours)
    for hour in listed[bisect.bisect_left(listed, first_second // SECONDS_PER_HOUR):]:
        low = hour * SECONDS_PER_HOUR
        high = low + SECONDS_PER_HOUR
        if low >= first_second and region(low) == region(high - 1):
            counts[region(low)] += _hour_live(hours, hour)
            continue
        live = _seconds_live(hours, hour)
        second = max(low, first_second)
        while second < high:
            where = region(second)
            if where == 0:
                stop = min(high, start_second)
            elif where <= buckets:
                stop = min(high, start_second + where * bucket_seconds)
            else:
                stop = high
            counts[where] += sum(live[second - low:stop - low])
            second = stop
    return DueHistogram(start_second, bucket_seconds, tuple(counts[1:-1]), counts[0],
                        counts[-1])


def _hour_live(hours: HourSet, hour: int) -> int:
    """The hour's messages less its cancelled ones."""
    segment = hours.open_segment(hour)
    if segment is not None:
        return segment.units - len(segment.tombstones)
    path = _hour_path(hours, hour)
    return file_size(path / INDEX) // UNIT_SIZE - file_size(path / TOMBSTONES) // TOMBSTONE.size


def _seconds_live(hours: HourSet, hour: int) -> list[int]:
    """Per second of the hour, its messages less its cancelled ones."""
    segment = hours.open_segment(hour)
    if segment is not None:
        return [filed - cancelled for filed, cancelled
                in zip(segment.heads[1::2], segment.cancelled, strict=True)]
    path = _hour_path(hours, hour)
    for _ in range(_HEADS_READS):
        opened = unpack_heads(read_file(path / HEADS))
        if opened is not None:
            break
    else:
        return [0] * SECONDS_PER_HOUR  # being rewritten: the hour is open, counted next time
    units, _, table = opened
    live = [count for _, count in HEAD.iter_unpack(table)]
    data = read_file(path / TOMBSTONES)
    for global_index in unpack_tombstones(hour, data):
        if global_index < units:
            unit = pread_file(path / INDEX, UNIT.size, global_index * UNIT_SIZE)
            if len(unit) == UNIT.size:
                live[UNIT.unpack(unit)[_SECOND_FIELD]] -= 1
    return live


def _hour_path(hours: HourSet, hour: int) -> Path:
    return hours.dir / f"{hour:08d}"
