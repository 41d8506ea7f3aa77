"""Live messages per tag, hour by hour: what the due-time histogram of one tag counts from.

The caller's tag (replication: its topic's number, `tickwheel.replication.pending`) is in each
message's index unit, so the wheel can count one tag's messages without knowing topics.
`TagHours` keeps, for each hour from the cursor's on, an ``array('i')`` indexed by tag: the
messages of that tag filed in the hour less those tombstoned since. It is kept exact where the
wheel changes, on the owner's thread: filing adds (`tickwheel.wheel.filing`), a tombstone
takes one off (`tickwheel.wheel.handles`), and an hour the cursor leaves is forgotten whole
(`Wheel.advance_cursor`); so a count never needs a walk of the hour's chains. Nothing is
stored on disk: `rebuild` counts the index files of the hours from the cursor's on when the
wheel opens (and after a snapshot install moved the cursor back), one sequential read of 40
bytes a message; an hour whose files a crash tore is counted again when it is repaired.

Bounded: an hour's array is as long as its highest tag plus one, so the memory is at most
4 bytes x (highest tag + 1) x (hours holding messages from the cursor's on), 36 MiB with
1,024 tracked topics over the 8,786 hours of a 366-day `max_delay_ms`, plus about 200 bytes
an hour.

`tag_seconds_live` counts one tag second by second in one hour, for an hour a bucket's edge
cuts: it reads that hour's units (in memory for an open segment, as one moment's; from its
files for a closed one). Any thread may call `live` and `tag_seconds_live`: an array element
read is atomic, and ``array.extend`` never loses an element another thread reads.
"""

from __future__ import annotations

import struct
from array import array
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tickwheel.wheel.fileio import INDEX, TOMBSTONES, read_file
from tickwheel.wheel.format import SECONDS_PER_HOUR, UNIT_SIZE, unpack_tombstones

if TYPE_CHECKING:
    from tickwheel.wheel.segment import HourSegment

SECOND_AND_TAG: Final = struct.Struct("<32xHH4x")
"""A unit's ``second_of_hour`` and ``tag``, the rest skipped (`tickwheel.wheel.format.UNIT`
and its CRC)."""
_LOCAL_INDEX: Final = struct.Struct("<12xI")
"""A unit's ``local_index``."""


class TagHours:
    """Per hour, per tag: messages filed less those cancelled. The owner changes it; any
    thread reads it."""

    def __init__(self) -> None:
        self._hours: dict[int, array[int]] = {}
        self._forgotten_below = 0

    def live(self, hour: int, tag: int) -> int:
        """Messages of ``tag`` in ``hour`` that are not cancelled."""
        counts = self._hours.get(hour)
        return counts[tag] if counts is not None and tag < len(counts) else 0

    def filed(self, hour: int, tags: Sequence[int]) -> None:
        """Messages with these tags were filed in ``hour``."""
        counts = self._hours.get(hour)
        if counts is None:
            counts = self._hours[hour] = array("i")
        first = tags[0] if tags else 0
        added = {first: len(tags)} if tags.count(first) == len(tags) else Counter(tags)
        for tag, count in added.items():
            if tag >= len(counts):
                counts.extend(array("i", [0]) * (tag + 1 - len(counts)))
            counts[tag] += count

    def cancelled(self, hour: int, tag: int) -> None:
        """A message of ``tag`` in ``hour`` was tombstoned."""
        counts = self._hours.get(hour)
        if counts is not None and tag < len(counts) and counts[tag] > 0:
            counts[tag] -= 1

    def forget_before(self, hour: int) -> None:
        """The cursor has left the hours before ``hour``: their counts go."""
        if hour <= self._forgotten_below:
            return
        self._forgotten_below = hour
        for passed in [h for h in self._hours if h < hour]:
            del self._hours[passed]

    def rebuild(self, hours_dir: Path, hours: Sequence[int]) -> None:
        """Count ``hours`` from their files (nothing buffered: the wheel just opened)."""
        counted: dict[int, array[int]] = {}
        for hour in hours:
            path = hours_dir / f"{hour:08d}"
            units = read_file(path / INDEX)
            tombstones = unpack_tombstones(hour, read_file(path / TOMBSTONES))
            counted[hour] = _tag_counts(units, tombstones)
        self._hours, self._forgotten_below = counted, 0

    def recount(self, segment: HourSegment) -> None:
        """Count ``segment``'s hour again from what it holds (it was repaired as it opened)."""
        units, tombstones = segment.units_and_tombstones()
        self._hours[segment.hour] = _tag_counts(units, tombstones)


def tag_seconds_live(segment: HourSegment | None, path: Path, hour: int, tag: int,
                     cursor: tuple[int, int] = (0, 0)) -> list[int]:
    """Per second of ``hour``, its messages of ``tag`` less the cancelled ones and those the
    ``cursor`` (second, local index) has passed in its own second: from ``segment`` if it is
    open, else from the files under ``path``."""
    if segment is not None:
        units, tombstones = segment.units_and_tombstones()
    else:
        units = read_file(path / INDEX)
        tombstones = set(unpack_tombstones(hour, read_file(path / TOMBSTONES)))
    units = units[:len(units) // UNIT_SIZE * UNIT_SIZE]
    live = [0] * SECONDS_PER_HOUR
    for second, unit_tag in SECOND_AND_TAG.iter_unpack(units):
        if unit_tag == tag:
            live[second] += 1
    count = len(units) // UNIT_SIZE
    passed = set()
    cursor_second, cursor_local_index = cursor
    if cursor_local_index and cursor_second // SECONDS_PER_HOUR == hour:
        in_second = cursor_second % SECONDS_PER_HOUR
        passed = {i for i in range(count) if SECOND_AND_TAG.unpack_from(
            units, i * UNIT_SIZE) == (in_second, tag) and _LOCAL_INDEX.unpack_from(
                units, i * UNIT_SIZE)[0] < cursor_local_index}
        live[in_second] -= len(passed)
    for global_index in tombstones:
        if global_index < count and global_index not in passed:
            second, unit_tag = SECOND_AND_TAG.unpack_from(units, global_index * UNIT_SIZE)
            if unit_tag == tag:
                live[second] -= 1
    return live


def _tag_counts(units: bytes, tombstones: Sequence[int] | set[int]) -> array[int]:
    """Per tag, the whole units of ``units`` less the tombstoned ones."""
    units = units[:len(units) // UNIT_SIZE * UNIT_SIZE]
    by_tag = Counter(tag for _, tag in SECOND_AND_TAG.iter_unpack(units))
    count = len(units) // UNIT_SIZE
    for global_index in set(tombstones):
        if global_index < count:
            by_tag[SECOND_AND_TAG.unpack_from(units, global_index * UNIT_SIZE)[1]] -= 1
    counts = array("i", [0]) * (max(by_tag, default=-1) + 1)
    for tag, live in by_tag.items():
        counts[tag] = live
    return counts
