"""How many messages are due in each bucket of time ahead: the due-time histogram.

Answered from counts the wheel keeps anyway, never from a walk of its chains: each hour's
heads hold how many messages were filed under each of its seconds, and each open segment how
many of those were cancelled since (`HourSegment.cancelled`, kept as tombstones are added).
The histogram's regions (before its start, each bucket, after the last) are ranges of
seconds; the hours lying whole inside one are counted from their sizes alone: an open hour
from ``units`` less its tombstones, a closed one from the same noted when it closed
(`HourSet.closed_live`), or, the first time after the wheel opened, from its files' sizes (two
``stat`` calls). Only an hour cut by a region's edge is read second by second, once: from
memory if it is open, else its heads file (28.8 KiB) and the units its tombstones name. So
the cost is one dictionary look-up per hour holding messages after the cursor, plus 3,600
additions for each hour cut, whatever the number of messages.

With a tag (the histogram of one topic), whole hours come from `TagHours` (that tag's live
messages per hour, kept as the wheel changes) and an hour cut by an edge from its units
(`tag_seconds_live`: 40 bytes read a message of that hour, whatever its tag).

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
import itertools
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
from tickwheel.wheel.tag_hours import tag_seconds_live

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


def due_histogram(hours: HourSet, cursor: tuple[int, int], start_second: int,
                  bucket_seconds: int, buckets: int, tag: int | None = None) -> DueHistogram:
    """Count the live messages filed from the ``cursor``'s second on into ``buckets`` buckets
    of ``bucket_seconds`` from ``start_second`` (and those before and after them); a bucket
    before the cursor counts nothing. With ``tag``, only the messages of that tag, and not
    those the cursor has passed in its own second."""
    cursor_second = cursor[0]
    # the regions' edges: [cursor, start) overdue, the buckets, [end, ...) beyond
    edges = [cursor_second, *(max(cursor_second, start_second + i * bucket_seconds)
                              for i in range(buckets + 1)), 1 << 62]
    listed = list(hours.hours)
    live_of = _HourCounts(hours) if tag is None else _TagHourCounts(hours, tag, cursor)
    counts = []
    for low, high in itertools.pairwise(edges):
        if low >= high:
            counts.append(0)
            continue
        first_whole = -(-low // SECONDS_PER_HOUR)  # the first hour starting at or after low
        last_whole = high // SECONDS_PER_HOUR  # the hours before it end by high
        count = sum(map(live_of.hour, listed[bisect.bisect_left(listed, first_whole):
                                             bisect.bisect_left(listed, last_whole)]))
        if first_whole > last_whole:  # low and high cut one hour
            count += live_of.seconds(low, high)
        else:
            if low % SECONDS_PER_HOUR:
                count += live_of.seconds(low, first_whole * SECONDS_PER_HOUR)
            if high % SECONDS_PER_HOUR and high < 1 << 62:
                count += live_of.seconds(last_whole * SECONDS_PER_HOUR, high)
        counts.append(count)
    return DueHistogram(start_second, bucket_seconds, tuple(counts[1:-1]), counts[0],
                        counts[-1])


class _HourCounts:
    """The live counts of one histogram's hours: whole, or second by second for an hour a
    region's edge cuts (read once, whichever edges cut it)."""

    def __init__(self, hours: HourSet) -> None:
        self._hours = hours
        self._known = set(hours.hours)
        self._seconds: dict[int, list[int]] = {}

    def hour(self, hour: int) -> int:
        """The hour's messages less its cancelled ones."""
        segment = self._hours.open_segment(hour)
        if segment is not None:
            return segment.units - len(segment.tombstones)
        return self._hours.closed_live(hour, lambda: _files_live(_hour_path(self._hours, hour)))

    def seconds(self, low: int, high: int) -> int:
        """Live messages filed in ``[low, high)``, within one hour."""
        hour = low // SECONDS_PER_HOUR
        if hour not in self._known:
            return 0
        live = self._seconds.get(hour)
        if live is None:
            live = self._seconds[hour] = _seconds_live(self._hours, hour)
        base = hour * SECONDS_PER_HOUR
        return sum(live[low - base:high - base])


class _TagHourCounts(_HourCounts):
    """`_HourCounts` of one tag's messages: whole hours from `TagHours`, an hour cut by an
    edge from its units (`tag_seconds_live`)."""

    def __init__(self, hours: HourSet, tag: int, cursor: tuple[int, int]) -> None:
        super().__init__(hours)
        self._tag = tag
        self._cursor = cursor

    def hour(self, hour: int) -> int:
        if hour == self._cursor[0] // SECONDS_PER_HOUR:  # less what the cursor passed
            return self.seconds(hour * SECONDS_PER_HOUR, (hour + 1) * SECONDS_PER_HOUR)
        return self._hours.tag_hours.live(hour, self._tag)

    def seconds(self, low: int, high: int) -> int:
        hour = low // SECONDS_PER_HOUR
        if hour not in self._known or not self._hours.tag_hours.live(hour, self._tag):
            return 0
        live = self._seconds.get(hour)
        if live is None:
            live = self._seconds[hour] = tag_seconds_live(
                self._hours.open_segment(hour), _hour_path(self._hours, hour), hour, self._tag,
                self._cursor)
        base = hour * SECONDS_PER_HOUR
        return sum(live[low - base:high - base])


def _files_live(path: Path) -> int:
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
