"""Filing: where each message of a batch goes, and appending it there.

A message is filed under its due second, or, when that is before the stamp's second or the
cursor's second, under the later of those two, after everything already there; so nothing is
ever filed behind the cursor. A batch is appended one run per hour (usually one), and the
messages due before the preload window's scan go straight into the window.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from tickwheel.common.errors import invariant
from tickwheel.wheel.chains import GLOBAL_INDEX_BITS
from tickwheel.wheel.format import MS_PER_SECOND, SECONDS_PER_HOUR
from tickwheel.wheel.hours import HourSet
from tickwheel.wheel.types import Cursor
from tickwheel.wheel.window import DueWindow

log = logging.getLogger("tickwheel.wheel")


def file_records(hours: HourSet, window: DueWindow, cursor: Cursor, stamp_ms: int,
                 records: Sequence[bytes], deliver_at_ms: Sequence[int],
                 tags: Sequence[int]) -> list[int]:
    """Append ``records`` (stamped ``stamp_ms``) to their hours; a handle for each, in order."""
    cursor_second = cursor.second
    floor_second = max(stamp_ms // MS_PER_SECOND, cursor_second)
    slots = [second if (second := due_ms // MS_PER_SECOND) > floor_second else floor_second
             for due_ms in deliver_at_ms]
    at_cursor = cursor_second in slots
    if at_cursor:  # rare: every message of the batch filed there moves, or none does
        moved = _past_cursor(hours, cursor)
        slots = [moved if slot == cursor_second else slot for slot in slots]
    handles: list[int] = []
    for hour, start, end in _hour_runs(slots):
        segment = hours.create(hour)
        run_slots = slots[start:end]
        first_offset = segment.log_size_bytes
        hour_second = hour * SECONDS_PER_HOUR
        first_global_index, local_indexes = segment.append_many(
            records[start:end], deliver_at_ms[start:end],
            [slot - hour_second for slot in run_slots], tags[start:end])
        hours.written(hour, segment.log_size_bytes - first_offset)
        hours.tag_hours.filed(hour, tags[start:end])
        first_handle = hour << GLOBAL_INDEX_BITS | first_global_index
        handles.extend(range(first_handle, first_handle + end - start))
        if at_cursor:
            invariant(all(local >= cursor.local_index for slot, local
                          in zip(run_slots, local_indexes, strict=True)
                          if slot == cursor_second),
                      f"a message filed behind the cursor in second {cursor_second}")
        if min(run_slots) < window.scan_second:
            window.add_filed(run_slots, deliver_at_ms[start:end], records[start:end],
                             local_indexes, first_handle, first_offset, tags[start:end])
    return handles


def _past_cursor(hours: HourSet, cursor: Cursor) -> int:
    """The cursor's second if a message filed there lands at or after the cursor, else the
    next second.

    The cursor's second normally holds at least ``cursor.local_index`` messages, so a new one
    gets a local index at or past the cursor. Only storage damage that removed done messages
    can make it hold fewer; the next second is then the first safe place.
    """
    slot = cursor.second
    hour, second_of_hour = divmod(slot, SECONDS_PER_HOUR)
    count = hours.create(hour).heads[(second_of_hour << 1) + 1]
    if count >= cursor.local_index:
        return slot
    log.warning("event=cursor_second_short slot_second=%d count=%d cursor_local_index=%d",
                slot, count, cursor.local_index)
    return slot + 1


def _hour_runs(slots: list[int]) -> Iterator[tuple[int, int, int]]:
    """``(hour, start, end)`` for each run of consecutive ``slots`` in the same hour; one run
    for the usual batch, found in two C-level passes."""
    if not slots:
        return
    hour = min(slots) // SECONDS_PER_HOUR
    if max(slots) // SECONDS_PER_HOUR == hour:
        yield hour, 0, len(slots)
        return
    start = 0
    hour = slots[0] // SECONDS_PER_HOUR
    for index, slot in enumerate(slots):
        if slot // SECONDS_PER_HOUR != hour:
            yield hour, start, index
            start, hour = index, slot // SECONDS_PER_HOUR
    yield hour, start, len(slots)
