"""The preload window: the index units of the seconds about to come due, in dispatch order.

The scan walks the occupied seconds ahead of the dispatch (``scan_second`` is the first it has
not loaded) and pushes each unit onto a queue ordered by ``(slot_second, deliver_at_ms,
local_index)``: dispatch order (a `RunHeap`: messages filed in due order cost it one comparison
each). A message filed for a second the scan has passed goes straight onto the queue. Loading
stops at ``max_window_msgs`` units, or at the preload horizon; a span that holds most of an
hour's units is read in one index scan instead of chain by chain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from tickwheel.common.errors import CorruptSegment
from tickwheel.common.runheap import RunHeap
from tickwheel.wheel.format import MS_PER_SECOND, SECONDS_PER_HOUR
from tickwheel.wheel.hours import HourSet
from tickwheel.wheel.mending import Unmended
from tickwheel.wheel.segment import HourSegment
from tickwheel.wheel.types import Cursor, DueMessage, WheelConfig

log = logging.getLogger("tickwheel.wheel")

GLOBAL_INDEX_BITS = 32
GLOBAL_INDEX_MASK = (1 << GLOBAL_INDEX_BITS) - 1
"""A handle is ``hour << GLOBAL_INDEX_BITS | global_index``."""

WindowEntry = tuple[int, int, int, int, int, int]
"""``(slot_second, deliver_at_ms, local_index, handle, log_offset, record_size)``. Their order is
dispatch order; the handle makes every entry unique."""


class _Loading:
    """A second whose chain is being read over several takes (`WheelConfig.max_load_units`),
    and the next unit to read (-1: the chain is done). What is read goes onto the queue at
    once (a push a unit, spread over the takes), but nothing of the second, or after it, is
    taken before it is whole: its order is dispatch order only then."""

    __slots__ = ("next_unit", "second")

    def __init__(self, second: int, next_unit: int) -> None:
        self.second = second
        self.next_unit = next_unit


class DueWindow:
    """The queue of loaded units and how far the scan has gone. ``on_skip(slot, local_index)``
    hears of every position passed over because its message is cancelled."""

    def __init__(self, hours: HourSet, config: WheelConfig, scan_second: int,
                 on_skip: Callable[[int, int], None]) -> None:
        self._hours = hours
        self._config = config
        self.scan_second = scan_second
        self._on_skip = on_skip
        self.queue = RunHeap[WindowEntry]()
        self._loading: _Loading | None = None
        self._budget = 0
        """Units the current take may still read from chains."""
        self.corrupt_records_skipped = 0
        self.held: str | None = None
        """Why the last `take` stopped at damage it could not mend yet (None: it did not)."""
        hours.in_use = self.hours_in_use

    def __len__(self) -> int:
        return len(self.queue)

    def hours_in_use(self) -> tuple[int, int]:
        """The first and last hour the window reads from."""
        first = self.queue.first()
        low = (first[0] if first is not None else self.scan_second) // SECONDS_PER_HOUR
        return low, self.scan_second // SECONDS_PER_HOUR

    @property
    def loading_second(self) -> int | None:
        """The second being loaded over several takes, if one is: until it is whole, a take
        stops short of it (and may hand out nothing although messages are due)."""
        return None if self._loading is None else self._loading.second

    def rewind(self, cursor_second: int) -> None:
        """Forget everything loaded; scan again from ``cursor_second``."""
        self.queue.clear()
        self._loading = None
        self.scan_second = cursor_second

    def add_filed(self, slots: list[int], deliver_at_ms: Sequence[int],
                  records: Sequence[bytes], local_indexes: list[int], first_handle: int,
                  offset: int) -> None:
        """Put the messages just filed in one hour that are due before the scan second onto
        the queue: the scan has passed their seconds already."""
        scan_second, push = self.scan_second, self.queue.push
        loading = self._loading
        for i, (slot, due_ms, record) in enumerate(zip(slots, deliver_at_ms, records,
                                                       strict=True)):
            if slot < scan_second or (loading is not None and slot == loading.second):
                push((slot, due_ms, local_indexes[i], first_handle + i, offset, len(record)))
            offset += len(record)

    def take(self, now_ms: int, max_msgs: int, cursor: Cursor) -> list[DueMessage]:
        """Pop up to ``max_msgs`` messages due at ``now_ms`` (see `Wheel.take_due`), loading
        as needed, and read their bodies. Damage that may yet be mended (`Unmended`, not
        everywhere) stops the take there, and is kept in ``held``: what lies behind it is
        neither taken nor skipped, so no cursor passes it. A record damaged everywhere is
        skipped (and counted): no copy of it exists any more."""
        self.held = None
        self._budget = self._config.max_load_units
        limit_second = (now_ms + self._config.preload_ms) // MS_PER_SECOND
        now_second = now_ms // MS_PER_SECOND
        queue, taken = self.queue, list[DueMessage]()
        new = tuple.__new__  # a namedtuple's own constructor is a Python call per message
        segment: HourSegment | None = None
        segment_hour = -1
        while len(taken) < max_msgs:
            if not queue or self._loading is not None:
                if not queue and self.scan_second > limit_second:
                    break
                try:
                    self.load_until(limit_second, max_msgs - len(taken), cursor)
                except Unmended as damage:
                    if damage.everywhere:
                        raise
                    self.rewind(cursor.second)  # the load stopped part way: start it again
                    self.held = str(damage)
                    break
                segment_hour = -1
                if not queue:
                    break
            entry = queue.pop()
            slot, deliver_at_ms, local_index, handle, offset, size = entry
            if deliver_at_ms > now_ms or slot > now_second or (
                    self._loading is not None and slot >= self._loading.second):
                queue.unpop(entry)
                break
            if (slot, local_index) < cursor:
                continue
            if segment is None or handle >> GLOBAL_INDEX_BITS != segment_hour:
                segment_hour = handle >> GLOBAL_INDEX_BITS
                segment = self._hours.existing(segment_hour)
            if handle & GLOBAL_INDEX_MASK in segment.tombstones:
                self._on_skip(slot, local_index)
                continue
            try:
                fields = segment.record(offset, size)
            except Unmended as error:
                if not error.everywhere:
                    queue.unpop(entry)
                    self.held = str(error)
                    break
                self._skip_corrupt(segment, entry, error)
                self._on_skip(slot, local_index)
                continue
            taken.append(new(DueMessage, (*fields[:5], handle, slot, local_index, fields[5])))
        return taken

    def _skip_corrupt(self, segment: HourSegment, entry: WindowEntry,
                      error: CorruptSegment) -> None:
        """A record failed its CRC and no copy of it is left: count it and say so loudly;
        it is never handed out."""
        slot, _, local_index, handle, offset, _ = entry
        self.corrupt_records_skipped += 1
        log.error("event=record_corrupt file=%s offset=%d handle=%d slot_second=%d "
                  "local_index=%d error=%r", segment.path / "log", offset, handle, slot,
                  local_index, str(error))

    def next_due_ms(self, cursor: Cursor) -> int | None:
        """When the next message is due (see `Wheel.next_due_ms`)."""
        self.drop_stale_top(cursor)
        first = self.queue.first()
        if self._loading is not None:  # what is not read yet may be due at its start
            start_ms = self._loading.second * MS_PER_SECOND
            return start_ms if first is None else min(start_ms, max(first[1], first[0]
                                                                    * MS_PER_SECOND))
        if first is not None:
            slot, deliver_at_ms = first[:2]
            return max(deliver_at_ms, slot * MS_PER_SECOND)
        second = self._hours.next_occupied_second(self.scan_second)
        return None if second is None else second * MS_PER_SECOND

    def drop_stale_top(self, cursor: Cursor) -> None:
        """Pop entries behind the cursor, of deleted hours, or cancelled since loaded."""
        queue = self.queue
        while (first := queue.first()) is not None:
            slot, _, local_index, handle, _, _ = first
            segment = self._hours.segment(handle >> GLOBAL_INDEX_BITS, create=False)
            if (slot, local_index) < cursor or segment is None:
                queue.pop()
                continue
            if handle & GLOBAL_INDEX_MASK not in segment.tombstones:
                return
            queue.pop()
            self._on_skip(slot, local_index)

    def load_until(self, limit_second: int, enough_msgs: int, cursor: Cursor) -> None:
        """Load the chains of occupied seconds up to ``limit_second``, one hour at a time,
        until the queue holds ``enough_msgs`` units (at most ``max_window_msgs``): the queue
        stays small, and so do its operations, however large the backlog. Stops where the
        take's ``max_load_units`` run out (a second too large for one take)."""
        enough_msgs = min(enough_msgs, self._config.max_window_msgs)
        loading = self._loading
        if loading is not None:
            if loading.second < self.scan_second:
                self._loading = None  # the cursor passed it
            else:
                segment = self._hours.existing(loading.second // SECONDS_PER_HOUR)
                self._hours.map_for_reading(segment)
                if not self._load_second(segment, loading.second, cursor):
                    return
                self.scan_second = loading.second + 1
        while self.scan_second <= limit_second and len(self.queue) < enough_msgs:
            second = self._hours.next_occupied_second(self.scan_second)
            if second is None or second > limit_second:
                self.scan_second = limit_second + 1
                return
            if not self._load_hour(second, limit_second, enough_msgs, cursor):
                return

    def _load_hour(self, first_second: int, limit_second: int, enough_msgs: int,
                   cursor: Cursor) -> bool:
        """Load the occupied seconds of ``first_second``'s hour from it up to ``limit_second``,
        second by second until the queue holds ``enough_msgs``, or in one index scan when the
        span holds most of the hour's units and fits under ``max_window_msgs`` and what is
        left of the take's ``max_load_units``. False when that budget ran out in the middle
        of a second."""
        hour = first_second // SECONDS_PER_HOUR
        segment = self._hours.existing(hour)
        self._hours.map_for_reading(segment)
        last_second = min(limit_second, (hour + 1) * SECONDS_PER_HOUR - 1)
        base_second = hour * SECONDS_PER_HOUR
        span_units = segment.units_between(first_second - base_second,
                                           last_second - base_second)
        if 2 * span_units >= segment.units and span_units <= self._budget and (
                len(self.queue) + span_units <= self._config.max_window_msgs):
            self._budget -= span_units
            self._load_span(segment, first_second, last_second, cursor)
            self.scan_second = last_second + 1
            return True
        bits = segment.occupied >> (first_second - base_second)
        bits &= (1 << (last_second - first_second + 1)) - 1
        second = first_second
        while bits and len(self.queue) < enough_msgs:
            skip = (bits & -bits).bit_length() - 1
            second += skip
            if not self._load_second(segment, second, cursor):
                self.scan_second = second
                return False
            bits >>= skip + 1
            second += 1
            self.scan_second = second
        if not bits:
            self.scan_second = last_second + 1
        return True

    def _load_second(self, segment: HourSegment, slot: int, cursor: Cursor) -> bool:
        """Read ``slot``'s chain (newest first) onto the queue, at most this take's budget of
        it; False while the second is not whole (`_Loading`)."""
        loading = self._loading
        if loading is None or loading.second != slot:
            loading = self._loading = _Loading(
                slot, segment.heads[(slot % SECONDS_PER_HOUR) << 1])
        done_below = cursor.local_index if slot == cursor.second else 0
        tombstones = segment.tombstones
        base = segment.hour << GLOBAL_INDEX_BITS
        push, unit, budget = self.queue.push, loading.next_unit, self._budget
        while unit >= 0 and budget:
            offset, size, local_index, global_index, unit, deliver_at_ms, _, _ = (
                segment.read_unit(unit))
            budget -= 1
            if local_index < done_below:
                unit = -1
            elif global_index not in tombstones:
                push((slot, deliver_at_ms, local_index, base | global_index, offset, size))
            else:
                self._on_skip(slot, local_index)
        self._budget = budget
        loading.next_unit = unit
        if unit >= 0:
            return False
        self._loading = None
        return True

    def _load_span(self, segment: HourSegment, first_second: int, last_second: int,
                   cursor: Cursor) -> None:
        """Load every unit filed under ``first_second..last_second`` with one index scan."""
        base_second = segment.hour * SECONDS_PER_HOUR
        tombstones = segment.tombstones
        base = segment.hour << GLOBAL_INDEX_BITS
        loaded = [
            (slot, deliver_at_ms, local_index, base | global_index, offset, size)
            for offset, size, local_index, global_index, _, deliver_at_ms, second_of_hour, _
            in segment.scan()
            if first_second <= (slot := base_second + second_of_hour) <= last_second
            and (slot, local_index) >= cursor
        ]
        if tombstones:
            for slot, _, local_index, handle, _, _ in loaded:
                if handle & GLOBAL_INDEX_MASK in tombstones:
                    self._on_skip(slot, local_index)
            loaded = [entry for entry in loaded
                      if entry[3] & GLOBAL_INDEX_MASK not in tombstones]
        self.queue.extend(loaded)
