"""The hour wheel on disk: which hours have a segment, and which segments are open.

An hour (``slot_second // 3600``) that holds messages has a segment folder. At most
``max_open_hours`` segments are open at once (an open hour holds up to ``FDS_PER_HOUR``
descriptors), least recently used closed first, except the hours the dispatch window reads
from. `HourSet` also counts the appends buffered in open segments (``dirty`` hours) and knows
which are mapped for reading, and how many live messages each closed hour holds
(`closed_live`, for `tickwheel.wheel.due`).
"""

from __future__ import annotations

import bisect
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from tickwheel.common.errors import InvariantViolation
from tickwheel.wheel.fileio import FDS_PER_HOUR
from tickwheel.wheel.format import SECONDS_PER_HOUR
from tickwheel.wheel.mending import Mender
from tickwheel.wheel.segment import HourSegment, remove_segment, segment_files
from tickwheel.wheel.tag_hours import TagHours

log = logging.getLogger("tickwheel.wheel")

HOURS_DIR = "hours"
_SPARE_FDS = 256  # for everything else the process opens


class HourSet:
    """The hours that have a segment (ascending) and the open ones among them."""

    def __init__(self, hours_dir: Path, hours: list[int], max_open_hours: int,
                 mender: Mender) -> None:
        self.dir = hours_dir
        self.mender = mender
        self.hours = hours
        self._max_open_hours = max_open_hours
        self._open: OrderedDict[int, HourSegment] = OrderedDict()
        self._dirty: set[int] = set()
        self._mapped: set[int] = set()
        self.buffered_bytes = 0
        """Appends buffered in open segments, not yet written (records and tombstones)."""
        self.in_use: Callable[[], tuple[int, int]] = lambda: (0, -1)
        """The hours (first, last) the dispatch window reads from: never evicted."""
        self._closed_live: dict[int, int] = {}
        """Live messages (units less tombstones) of closed hours, noted as they close or
        first read from their files; an hour's entry goes when it opens."""
        self.tag_hours = TagHours()
        """Live messages per tag per hour (`tickwheel.wheel.tag_hours`), kept by the owner."""
        self._closed_sizes: dict[int, dict[str, int]] = {}
        """The files' lengths of closed hours, noted as they close or first listed (a closed
        hour's files do not change); an hour's entry goes when it opens."""
        self._opens = 0
        self._noting = threading.Lock()
        """Between the owner opening an hour and another thread noting a count it read."""

    @classmethod
    def open(cls, root: Path, max_open_hours: int, mender: Mender) -> HourSet:
        hours_dir = root / HOURS_DIR
        hours_dir.mkdir(parents=True, exist_ok=True)
        hours = sorted(int(name) for name in os.listdir(hours_dir) if name.isdigit())
        opened = cls(hours_dir, hours, _open_hours_within_fd_limit(max_open_hours), mender)
        for hour in hours:  # read here, not by the first snapshot's listing (`lengths`)
            opened._note_sizes(hour)
        return opened

    def segment(self, hour: int, *, create: bool) -> HourSegment | None:
        """The open segment of ``hour``; opened (or created, if ``create``) on demand."""
        segment = self._open.get(hour)
        if segment is not None:
            self._open.move_to_end(hour)
            return segment
        position = bisect.bisect_left(self.hours, hour)
        exists = position < len(self.hours) and self.hours[position] == hour
        if not exists:
            if not create:
                return None
            self.hours.insert(position, hour)
        self._evict()
        with self._noting:
            self._closed_live.pop(hour, None)
            self._opens += 1
        self._closed_sizes.pop(hour, None)
        segment = HourSegment.open(self.dir, hour, self.mender)
        if segment.repaired:
            self.tag_hours.recount(segment)
        self._open[hour] = segment
        return segment

    def open_segment(self, hour: int) -> HourSegment | None:
        """``hour``'s segment if it is open now, else None; opens nothing (any thread: one
        ``dict.get``)."""
        return self._open.get(hour)

    def closed_live(self, hour: int, read: Callable[[], int]) -> int:
        """The live messages of a closed ``hour``: as noted when it closed, else ``read()``
        from its files and noted, unless an hour opened meanwhile (any thread)."""
        live = self._closed_live.get(hour)
        if live is None:
            opens = self._opens
            live = read()
            with self._noting:
                if opens == self._opens and hour not in self._open:
                    self._closed_live[hour] = live
        return live

    def create(self, hour: int) -> HourSegment:
        """The segment of ``hour``, created if it has none."""
        segment = self.segment(hour, create=True)
        if segment is None:
            raise InvariantViolation(f"hour {hour} has no segment after creating it")
        return segment

    def existing(self, hour: int) -> HourSegment:
        """The segment of an hour known to have one."""
        segment = self.segment(hour, create=False)
        if segment is None:
            raise InvariantViolation(f"hour {hour} has no segment")
        return segment

    def written(self, hour: int, size_bytes: int) -> None:
        """``size_bytes`` more were appended to ``hour``'s segment, buffered until a flush."""
        self._dirty.add(hour)
        self.buffered_bytes += size_bytes

    def flush_through(self, last_hour: int) -> None:
        """Write the buffered appends of every hour up to ``last_hour``."""
        for hour in sorted(h for h in self._dirty if h <= last_hour):
            self.flush_hour(hour)

    def unflushed(self) -> list[int]:
        """The hours with appends buffered, not yet written."""
        return sorted(self._dirty)

    def flush_hour(self, hour: int) -> None:
        """Write the buffered appends of ``hour``, if it has any."""
        if hour in self._dirty:
            segment = self._open[hour]
            self._forget_buffer(hour, segment)
            segment.flush()

    def flush(self) -> None:
        """Write every buffered append."""
        for hour in sorted(self._dirty):
            self._open[hour].flush()  # dirty hours are always open: eviction flushes first
        self._dirty.clear()
        self.buffered_bytes = 0

    def next_occupied_second(self, from_second: int) -> int | None:
        """The first second at or after ``from_second`` holding a message: hour wheel first,
        then the occupancy bits of one hour; empty hours and seconds are skipped, not visited."""
        first_hour = from_second // SECONDS_PER_HOUR
        for position in range(bisect.bisect_left(self.hours, first_hour), len(self.hours)):
            hour = self.hours[position]
            segment = self.existing(hour)
            start = max(0, from_second - hour * SECONDS_PER_HOUR)
            bits = segment.occupied >> start
            if bits:
                return hour * SECONDS_PER_HOUR + start + (bits & -bits).bit_length() - 1
        return None

    def count_at(self, second: int) -> int:
        """How many messages are filed under ``second`` (cancelled ones included)."""
        hour, second_of_hour = divmod(second, SECONDS_PER_HOUR)
        segment = self.segment(hour, create=False)
        return 0 if segment is None else segment.heads[(second_of_hour << 1) + 1]

    def map_for_reading(self, segment: HourSegment) -> None:
        """Map ``segment`` for reading, once; `release_maps` unmaps it when passed."""
        if segment.hour not in self._mapped:
            segment.map_for_reading()
            self._mapped.add(segment.hour)

    def release_maps(self, below_hour: int) -> None:
        """Unmap the hours before ``below_hour``: the dispatch has left them behind."""
        for hour in [h for h in self._mapped if h < below_hour]:
            self._mapped.discard(hour)
            if hour in self._open:
                self._open[hour].unmap()

    def before(self, hour: int) -> list[int]:
        """The hours on disk before ``hour``."""
        return self.hours[:bisect.bisect_left(self.hours, hour)]

    def delete(self, hour: int, cursor_second: int) -> None:
        """Delete ``hour``'s files (the cursor, at ``cursor_second``, has passed it)."""
        self._remove(hour, cursor_second)
        self.hours.remove(hour)

    def lengths(self, first_hour: int) -> dict[str, int]:
        """The append-only files of the hours from ``first_hour`` on, by path relative to the
        wheel's root, with the lengths they have once every buffered append is written: read
        from memory (an open hour's segment; a closed hour's lengths as noted), so that a
        snapshot can name them without a flush or a ``stat`` a file. A closed hour not yet
        noted is read from its files once."""
        listed = {}
        for hour in self.hours[bisect.bisect_left(self.hours, first_hour):]:
            segment = self._open.get(hour)
            if segment is not None:
                sizes = segment.sizes()
            else:
                sizes = self._closed_sizes.get(hour) or self._note_sizes(hour)
            for name, size in sizes.items():
                listed[f"{HOURS_DIR}/{hour:08d}/{name}"] = size
        return listed

    def _note_sizes(self, hour: int) -> dict[str, int]:
        """Read and note the lengths of a closed hour's files (those that are not empty)."""
        sizes = {name: size for name, size in segment_files(self.dir, hour).items() if size}
        self._closed_sizes[hour] = sizes
        return sizes

    def close(self) -> None:
        for segment in self._open.values():
            segment.close()
        self._open.clear()
        self._closed_sizes.clear()

    def _evict(self) -> None:
        """Make room for one more segment within ``max_open_hours`` by closing the least
        recently used, sparing the hours the dispatch window reads from (which may exceed the
        limit for as long as the window needs them)."""
        excess = len(self._open) + 1 - self._max_open_hours
        if excess <= 0:
            return
        low, high = self.in_use()
        for hour in [h for h in self._open if not low <= h <= high][:excess]:
            segment = self._open.pop(hour)
            self._forget_buffer(hour, segment)
            self._mapped.discard(hour)
            segment.close()
            self._closed_sizes[hour] = segment.sizes()
            with self._noting:
                self._closed_live[hour] = segment.units - len(segment.tombstones)

    def _forget_buffer(self, hour: int, segment: HourSegment) -> None:
        """Stop counting ``segment``'s buffered appends: it is about to write or drop them."""
        if hour in self._dirty:
            self.buffered_bytes -= segment.buffered_bytes
            self._dirty.discard(hour)

    def _remove(self, hour: int, cursor_second: int) -> None:
        self._closed_live.pop(hour, None)
        self._closed_sizes.pop(hour, None)
        segment = self._open.pop(hour, None)
        if segment is not None:
            self._forget_buffer(hour, segment)
            segment.discard()
        self._mapped.discard(hour)
        remove_segment(self.dir, hour)
        log.info("event=hour_deleted hour=%d cursor_second=%d", hour, cursor_second)


def _open_hours_within_fd_limit(max_open_hours: int) -> int:
    """``max_open_hours``, or fewer if the process may not open enough files.

    An open hour holds up to ``FDS_PER_HOUR`` descriptors. The soft ``RLIMIT_NOFILE`` is raised
    towards the hard one when needed; if that is still short, fewer hours stay open (slower
    when inserts are spread over more hours than that), and the log says so.
    """
    needed = max_open_hours * FDS_PER_HOUR + _SPARE_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_open_hours
    fitting = max(2, (soft - _SPARE_FDS) // FDS_PER_HOUR)
    log.warning("event=open_hours_capped max_open_hours=%d fitting=%d nofile_soft=%d",
                max_open_hours, fitting, soft)
    return fitting
