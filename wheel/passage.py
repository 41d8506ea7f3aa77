"""The cursor's passage: which messages (by tag) the cursor passes as it moves, read ahead.

A replicated state machine keeps per-tag pending counts with the cursor, the same on every
replica, so each cursor move must count the live (not cancelled) messages it passes. Reading a
busy second's chain at once stalled every replica (a second of 20,000 messages took 12 ms);
`walk_ahead` reads the next second's units in steps between turns, and a second the cursor
crosses in several steps is read once: its units are kept until the cursor leaves it. A second
read ahead and filed into afterwards by more than a step's units is read again in steps (a
million-message burst filed into a second read while it was empty but for a few: the cursor
command entering it read the million at once on every replica, and the leader lost office).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tickwheel.common.errors import CorruptSegment, invariant
from tickwheel.wheel.format import SECONDS_PER_HOUR
from tickwheel.wheel.hours import HourSet
from tickwheel.wheel.segment import HourSegment
from tickwheel.wheel.types import Cursor

_WALKED = -1
"""`_SecondUnits.resume` once the whole chain is read."""
WHOLE_SECOND_RATIO = 8
"""A whole second is counted from its running counts when its hour holds fewer cancelled
messages than an eighth of the second's (each is read to see whether it is the second's)."""
AHEAD_SECONDS = 120
"""How far past the cursor's second `CursorPassage.walk_ahead` reads: 6 bytes a message due
within it (at 20,000 due msg/s, 14 MB)."""


@dataclass(slots=True)
class _SecondUnits:
    """The units of a second the cursor is about to pass: the global index and tag of each
    (6 bytes a message). While `CursorPassage.walk_ahead` reads the chain in steps they are
    newest first and ``resume`` names the next unit to read (None before the first step);
    once read (``resume`` is `_WALKED`) they are in local index order."""

    global_indexes: array[int] = field(default_factory=lambda: array("I"))
    tags: array[int] = field(default_factory=lambda: array("H"))
    resume: int | None = None
    counts: Counter[int] = field(default_factory=Counter)
    """How many of the units read are of each tag, counted as they are read: a cursor that
    passes the whole second counts it without a pass over a million tags at once."""


class CursorPassage:
    """The units of the seconds the cursor is passing, by second."""

    def __init__(self, hours: HourSet) -> None:
        self._hours = hours
        self._passing: dict[int, _SecondUnits] = {}
        self.units_read = 0
        """Index units read from the chains since the wheel opened (what read-ahead costs)."""

    def forget_before(self, second: int) -> None:
        """The cursor has left every second before ``second``."""
        for passed in [s for s in self._passing if s < second]:
            del self._passing[passed]

    def clear(self) -> None:
        """The files were replaced (a snapshot was installed): nothing read still holds."""
        self._passing.clear()

    def live_tags_between(self, start: Cursor, end: Cursor) -> dict[int, int]:
        """How many messages of each tag lie at or after ``start`` and before ``end`` and are
        not cancelled (see `Wheel.live_tags_until`)."""
        counts: Counter[int] = Counter()
        second, local_index = start
        while (second, local_index) < end:
            segment = self._hours.segment(second // SECONDS_PER_HOUR, create=False)
            if segment is not None:
                units = self._units_of(segment, second)
                stop = end.local_index if second == end.second else len(units.tags)
                whole = (None if local_index or stop < len(units.tags)
                         or len(segment.tombstones) * WHOLE_SECOND_RATIO >= stop
                         else _live(segment, second, units.counts))
                counts.update(_live_between(segment, units, local_index, stop)
                              if whole is None else whole)
            following = self._hours.next_occupied_second(second + 1)
            if following is None:
                break
            second, local_index = following, 0
        return dict(counts)

    def walk_ahead(self, cursor_second: int, max_units: int,
                   now_second: int | None = None) -> None:
        """Read up to ``max_units`` index units of the seconds the cursor will pass next (the
        seconds holding messages from its own on, up to ``AHEAD_SECONDS`` past the first, in
        order), once the first is due within ``AHEAD_SECONDS`` of ``now_second`` (None: at
        any distance); nothing once they are read. A second of a million messages is read
        over the turns before its time comes, not by the cursor command entering it (which
        held every replica's Raft thread 100-250 ms when only the next second was read
        ahead), and the seconds a cursor held at a burst's second jumps over when the burst
        is out are read already. A second due later is left until it comes within reach: read
        early, it was read again from its start whenever more than a step's units were filed
        into it, a step on every turn of the Raft thread (200,000 scheduled two hours ahead
        were read again in the 50 turns after their filing, 2-4 ms each, while other
        schedule requests waited for those turns)."""
        second = self._hours.next_occupied_second(cursor_second)
        if second is not None and now_second is not None and second > now_second + AHEAD_SECONDS:
            return
        last_second = -1 if second is None else second + AHEAD_SECONDS
        while second is not None and second <= last_second and max_units:
            segment = self._hours.segment(second // SECONDS_PER_HOUR, create=False)
            if segment is not None and (
                    count := segment.heads[((second % SECONDS_PER_HOUR) << 1) + 1]):
                units = self._units(second)
                if units.resume == _WALKED and count - len(units.tags) > max_units:
                    # filed into since it was read (a burst scheduled into a second read
                    # while it was still the next one holding messages): read again, in steps,
                    # rather than all the new units in the cursor command that enters it
                    units = self._passing[second] = _SecondUnits()
                if units.resume != _WALKED:
                    before = len(units.tags)
                    self._walk(segment, second, units, max_units)
                    max_units -= len(units.tags) - before
            second = self._hours.next_occupied_second(second + 1)

    def _units_of(self, segment: HourSegment, second: int) -> _SecondUnits:
        """The global index and tag of each message filed under ``second``, by local index:
        read to the end now if `walk_ahead` has not, and extended by what was filed since."""
        units = self._units(second)
        self._walk(segment, second, units, max_units=segment.units)
        second_of_hour = second % SECONDS_PER_HOUR
        count = segment.heads[(second_of_hour << 1) + 1]
        if len(units.tags) < count:
            newer_globals, newer_tags = array("I"), array("H")
            segment.walk_chain(segment.heads[second_of_hour << 1], len(units.tags), count,
                               newer_globals, newer_tags)
            self.units_read += len(newer_tags)
            newer_globals.reverse()
            newer_tags.reverse()
            units.global_indexes += newer_globals
            units.tags += newer_tags
            units.counts.update(newer_tags)
        invariant(len(units.tags) == count,
                  f"second {second} chains {len(units.tags)} units of {count}")
        return units

    def _walk(self, segment: HourSegment, second: int, units: _SecondUnits,
              max_units: int) -> None:
        """Walk on down the chain of ``second`` for up to ``max_units`` units; once at its
        end, the units are put in local index order."""
        if units.resume == _WALKED:
            return
        self._hours.map_for_reading(segment)
        start = (segment.heads[(second % SECONDS_PER_HOUR) << 1] if units.resume is None
                 else units.resume)
        read = len(units.tags)
        resume = segment.walk_chain(start, 0, max_units, units.global_indexes, units.tags)
        self.units_read += len(units.tags) - read
        units.counts.update(units.tags[read:])
        if resume < 0:
            units.global_indexes.reverse()
            units.tags.reverse()
            units.resume = _WALKED
        else:
            units.resume = resume

    def _units(self, second: int) -> _SecondUnits:
        units = self._passing.get(second)
        if units is None:
            units = self._passing[second] = _SecondUnits()
        return units


def _live(segment: HourSegment, second: int, counts: Counter[int]) -> Counter[int] | None:
    """``counts`` of a whole second, less its cancelled messages (the hour's tombstones that
    are units of ``second``); None if a tombstone's unit cannot be read (the second is then
    counted unit by unit)."""
    live = Counter(counts)
    second_of_hour = second % SECONDS_PER_HOUR
    for global_index in segment.tombstones:
        try:
            unit = segment.read_unit(global_index)
        except CorruptSegment:
            return None
        if unit[6] == second_of_hour:
            live[unit[7]] -= 1
    return +live


def _live_between(segment: HourSegment, units: _SecondUnits, start: int, stop: int
                  ) -> Iterable[int]:
    """The tags of the second's units from local index ``start`` to ``stop``, less the
    cancelled ones, unit by unit."""
    passed = units.global_indexes[start:stop]
    if segment.tombstones and not segment.tombstones.isdisjoint(passed):
        tombstones = segment.tombstones
        return (tag for global_index, tag in zip(passed, units.tags[start:stop], strict=True)
                if global_index not in tombstones)
    return units.tags[start:stop]  # nothing cancelled among them: counted in C
