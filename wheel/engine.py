"""The two-level wheel over hour segments: scheduling, cancelling, taking what is due, the cursor.

See the package docstring (`tickwheel.wheel`) for the algorithm, its costs and a worked example.
"""

from __future__ import annotations

import bisect
import fcntl
import heapq
import logging
import os
import resource
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tickwheel.wheel.errors import (
    CorruptSegment,
    InvalidMessage,
    StorageLocked,
    UnknownHandle,
    invariant,
)
from tickwheel.wheel.format import (
    META,
    META_COPIES,
    MS_PER_SECOND,
    SECONDS_PER_HOUR,
    TOMBSTONE,
    decode_record,
    encode_record,
    pack_meta,
    unpack_meta,
)
from tickwheel.wheel.segment import FDS_PER_HOUR, HourSegment, remove_segment, segment_files
from tickwheel.wheel.types import CancelOutcome, Cursor, DueMessage, NewMessage, WheelConfig

log = logging.getLogger("tickwheel.wheel")

_GLOBAL_INDEX_BITS = 32
_GLOBAL_INDEX_MASK = (1 << _GLOBAL_INDEX_BITS) - 1
_SPARE_FDS = 256  # for everything else the process opens
_HOURS_DIR = "hours"
_META = "meta"
_LOCK = "LOCK"

# A window entry: (slot_second, deliver_at_ms, local_index, handle, log_offset, record_size).
# Heap order is dispatch order; the handle makes every entry unique.
_WindowEntry = tuple[int, int, int, int, int, int]


class Wheel:
    """A durable delayed-message store that hands messages out in due order.

    Single-threaded: one owner calls every method. Time comes in as arguments (``now_ms``);
    the wheel never reads a clock. Use `Wheel.open` and close it (or use it as a context manager).
    """

    def __init__(self, root: Path, config: WheelConfig, fds: tuple[int, int],
                 meta: tuple[int, Cursor, int], hours: list[int], max_open_hours: int,
                 replicated: bool) -> None:
        self._root = root
        self._hours_dir = root / _HOURS_DIR
        self._config = config
        self._lock_fd, self._meta_fd = fds
        self._meta_sequence, self._cursor, self._stamp_ms = meta
        self._hours = hours
        self._max_open_hours = max_open_hours
        self._open: OrderedDict[int, HourSegment] = OrderedDict()
        self._dirty: set[int] = set()
        self._mapped: set[int] = set()
        self._buffered_bytes = 0
        self._window: list[_WindowEntry] = []
        self._scan_second = self._cursor.second
        self._replicated = replicated
        self._skipped: list[Cursor] = []
        self._passing: dict[int, _SecondUnits] = {}
        self.corrupt_records_skipped = 0

    @classmethod
    def open(cls, root: Path | str, config: WheelConfig | None = None, *,
             replicated: bool = False) -> Wheel:
        """Open the wheel stored under ``root`` (created if absent).

        Cost: one directory listing and the ``meta`` file; hour segments open lazily, each from
        its heads checkpoint. Raises `StorageLocked` if another process has it open.

        ``replicated`` is for a wheel that is the state machine of a Raft log: hours the cursor
        has passed stay on disk until `delete_hour` (a snapshot may still name them), and
        positions passed over without being handed out are reported by `drain_skipped`.
        """
        root = Path(root)
        (root / _HOURS_DIR).mkdir(parents=True, exist_ok=True)
        config = config or WheelConfig()
        with ExitStack() as on_failure:
            lock_fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            on_failure.callback(os.close, lock_fd)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StorageLocked(str(root)) from None
            meta_fd = os.open(root / _META, os.O_RDWR | os.O_CREAT, 0o644)
            on_failure.callback(os.close, meta_fd)
            meta = unpack_meta(os.pread(meta_fd, META_COPIES * META.size, 0), str(root / _META))
            sequence, second, local_index, stamp_ms = meta or (0, 0, 0, 0)
            cursor = Cursor(second, local_index)
            hours = sorted(int(name) for name in os.listdir(root / _HOURS_DIR) if name.isdigit())
            wheel = cls(root, config, (lock_fd, meta_fd), (sequence, cursor, stamp_ms), hours,
                        _open_hours_within_fd_limit(config.max_open_hours), replicated)
            if not replicated:
                wheel._delete_passed_hours()
            on_failure.pop_all()
        log.info("event=wheel_opened root=%s hours=%d cursor_second=%d cursor_local_index=%d",
                 root, len(hours), cursor.second, cursor.local_index)
        return wheel

    # -- the public surface ---------------------------------------------------------------

    @property
    def cursor(self) -> Cursor:
        return self._cursor

    @property
    def stamp_ms(self) -> int:
        """The latest time stamp applied; it never decreases."""
        return self._stamp_ms

    @property
    def window_msgs(self) -> int:
        """Index units held in memory by the preload window."""
        return len(self._window)

    @property
    def hours(self) -> list[int]:
        """The hour wheel: hours (``slot_second // 3600``) that have a segment, ascending."""
        return list(self._hours)

    def schedule(self, messages: Sequence[NewMessage], now_ms: int) -> list[int]:
        """File ``messages`` and return a handle for each, in order.

        ``now_ms`` stamps the batch; stamps are made monotonic (``max`` with the last one). A
        message is filed under its due second, or, when that is before the stamp's second or
        the cursor's second, under the later of those two, after everything already there; so
        nothing is ever filed behind the cursor. All messages are validated before any is
        written: an `InvalidMessage` leaves the wheel unchanged.
        """
        self.check_delays([message.deliver_at_ms for message in messages], now_ms)
        records = [encode_record(*message) for message in messages]
        return self.schedule_records(records, [m.deliver_at_ms for m in messages], now_ms)

    def check_delays(self, deliver_at_ms: Sequence[int], now_ms: int) -> None:
        """Raise `InvalidMessage` if any due time is beyond ``max_delay_ms`` of the stamp."""
        stamp_ms = max(now_ms, self._stamp_ms)
        latest_ms = stamp_ms + self._config.max_delay_ms
        if max(deliver_at_ms, default=latest_ms) <= latest_ms:
            return  # the usual case, in one C-level pass
        for due_ms in deliver_at_ms:
            if due_ms > latest_ms:
                raise InvalidMessage("deliver_at_ms", f"{due_ms} is more than "
                                     f"{self._config.max_delay_ms} ms after {stamp_ms}")

    def schedule_records(self, records: Sequence[bytes], deliver_at_ms: Sequence[int],
                         now_ms: int, tags: Sequence[int] | None = None) -> list[int]:
        """`schedule` for records already encoded by `tickwheel.wheel.format.encode_record`.

        Replication encodes once on the leader and every replica files the same bytes. The
        caller has validated the delays (`check_delays`); they are checked again here.
        ``tags`` (16 bits each, 0 when absent) are stored with the messages and come back from
        `live_tags_until` and `cancel_tag`.
        """
        self.check_delays(deliver_at_ms, now_ms)
        stamp_ms = max(now_ms, self._stamp_ms)
        self._stamp_ms = stamp_ms
        cursor_second = self._cursor.second
        floor_second = max(stamp_ms // MS_PER_SECOND, cursor_second)
        slots = [second if (second := due_ms // MS_PER_SECOND) > floor_second else floor_second
                 for due_ms in deliver_at_ms]
        at_cursor = cursor_second in slots
        if at_cursor:  # rare: every message of the batch filed there moves, or none does
            moved = self._past_cursor(cursor_second)
            slots = [moved if slot == cursor_second else slot for slot in slots]
        if tags is None:
            tags = [0] * len(records)
        handles: list[int] = []
        for hour, start, end in _hour_runs(slots):
            segment = self._segment(hour, create=True)
            self._dirty.add(hour)
            run_slots = slots[start:end]
            first_offset = segment.log_size_bytes
            hour_second = hour * SECONDS_PER_HOUR
            first_global_index, local_indexes = segment.append_many(
                records[start:end], deliver_at_ms[start:end],
                [slot - hour_second for slot in run_slots], tags[start:end])
            first_handle = hour << _GLOBAL_INDEX_BITS | first_global_index
            handles.extend(range(first_handle, first_handle + end - start))
            if at_cursor:
                invariant(all(local >= self._cursor.local_index for slot, local
                              in zip(run_slots, local_indexes, strict=True)
                              if slot == cursor_second),
                          f"a message filed behind the cursor in second {cursor_second}")
            if min(run_slots) < self._scan_second:
                self._add_to_window(run_slots, deliver_at_ms[start:end],
                                    records[start:end], local_indexes, first_handle,
                                    first_offset)
        self._buffered_bytes += sum(map(len, records))
        if self._buffered_bytes > self._config.max_buffered_bytes:
            self.flush()
        return handles

    def _add_to_window(self, slots: list[int], deliver_at_ms: Sequence[int],
                       records: Sequence[bytes], local_indexes: list[int], first_handle: int,
                       offset: int) -> None:
        """Put the messages just filed in one hour that are due before the scan second into
        the preload window: the scan has passed their seconds already."""
        scan_second, window = self._scan_second, self._window
        for i, (slot, due_ms, record) in enumerate(zip(slots, deliver_at_ms, records,
                                                       strict=True)):
            if slot < scan_second:
                heapq.heappush(window, (slot, due_ms, local_indexes[i], first_handle + i,
                                        offset, len(record)))
            offset += len(record)

    def _past_cursor(self, slot: int) -> int:
        """``slot`` if a message filed there lands at or after the cursor, else the next second.

        The cursor's second normally holds at least ``cursor.local_index`` messages, so a new
        one gets a local index at or past the cursor. Only storage damage that removed done
        messages can make it hold fewer; the next second is then the first safe place.
        """
        hour, second_of_hour = divmod(slot, SECONDS_PER_HOUR)
        segment = self._segment(hour, create=True)
        if segment.heads[(second_of_hour << 1) + 1] >= self._cursor.local_index:
            return slot
        log.warning("event=cursor_second_short slot_second=%d count=%d cursor_local_index=%d",
                    slot, segment.heads[(second_of_hour << 1) + 1], self._cursor.local_index)
        return slot + 1

    def cancel(self, handle: int) -> CancelOutcome:
        """Tombstone the message ``handle`` names, and say what that did (`CancelOutcome`).

        A message already handed out by `take_due` but not yet behind the cursor is still
        cancelled: it will not be handed out again. A tombstone is checked before the cursor,
        so a repeated cancel reads ``ALREADY_CANCELLED`` until the message's hour is deleted.
        Raises `UnknownHandle` for a handle never returned.
        """
        return self.cancel_tag(handle)[0]

    def cancel_tag(self, handle: int) -> tuple[CancelOutcome, int]:
        """`cancel`, and the tag of the message when this call cancelled it (else 0)."""
        if handle < 0:
            raise UnknownHandle("handle", f"{handle} was never returned by schedule")
        hour, global_index = handle >> _GLOBAL_INDEX_BITS, handle & _GLOBAL_INDEX_MASK
        if (hour + 1) * SECONDS_PER_HOUR <= self._cursor.second:
            return CancelOutcome.NOT_PENDING, 0  # its hour is behind the cursor, and deleted
        segment = self._segment(hour, create=False)
        if segment is None or global_index >= segment.units:
            raise UnknownHandle("handle", f"{handle} was never returned by schedule")
        if global_index in segment.tombstones:
            return CancelOutcome.ALREADY_CANCELLED, 0
        fields = segment.read_unit(global_index)
        if Cursor(hour * SECONDS_PER_HOUR + fields[6], fields[2]) < self._cursor:
            return CancelOutcome.NOT_PENDING, 0
        segment.add_tombstone(global_index)
        self._dirty.add(hour)
        self._buffered_bytes += TOMBSTONE.size
        return CancelOutcome.CANCELLED, fields[7]

    def next_due_ms(self) -> int | None:
        """When the next message is due, or None if nothing is pending ahead of the dispatch.

        Exact for seconds already loaded; for a second beyond the preload window it is the
        start of that second (early by under a second, never late). An arrival that is due
        earlier changes the answer. Cost: O(1) plus one skip per empty hour, never per empty
        second.
        """
        self._drop_stale_top()
        if self._window:
            slot, deliver_at_ms = self._window[0][:2]
            return max(deliver_at_ms, slot * MS_PER_SECOND)
        second = self._next_occupied_second(self._scan_second)
        return None if second is None else second * MS_PER_SECOND

    def take_due(self, now_ms: int, max_msgs: int) -> list[DueMessage]:
        """Hand out up to ``max_msgs`` messages due at ``now_ms``, in dispatch order.

        A message is handed out once per dispatch pass; `rewind` starts a new pass from the
        cursor. Cancelled messages and messages behind the cursor are never handed out. Reading
        the body happens here, not before.
        """
        invariant(max_msgs > 0, f"take_due max_msgs={max_msgs}")
        limit_second = (now_ms + self._config.preload_ms) // MS_PER_SECOND
        now_second = now_ms // MS_PER_SECOND
        window, taken, cursor = self._window, [], self._cursor
        segment, segment_hour = None, -1
        while len(taken) < max_msgs:
            if not window:
                if self._scan_second > limit_second:
                    break
                self._load_until(limit_second, enough_msgs=max_msgs - len(taken))
                segment_hour = -1
                if not window:
                    break
            entry = heapq.heappop(window)
            slot, deliver_at_ms, local_index, handle, offset, size = entry
            if deliver_at_ms > now_ms or slot > now_second:
                heapq.heappush(window, entry)
                break
            if (slot, local_index) < cursor:
                continue
            if handle >> _GLOBAL_INDEX_BITS != segment_hour:
                segment_hour = handle >> _GLOBAL_INDEX_BITS
                segment = self._segment(segment_hour, create=False)
            if handle & _GLOBAL_INDEX_MASK in segment.tombstones:
                self._skip(slot, local_index)
                continue
            try:
                fields = decode_record(segment.read_record(offset, size))
            except CorruptSegment as error:
                self._skip_corrupt(segment, entry, error)
                self._skip(slot, local_index)
                continue
            taken.append(DueMessage(*fields[:5], handle, slot, local_index, fields[5]))
        self._release_maps()
        return taken

    def advance_cursor(self, cursor: Cursor, now_ms: int | None = None) -> None:
        """Move the cursor forward (never back) and delete the hours it has passed.

        Appends at or before the cursor's hour are flushed before the cursor is written, so a
        crash can never leave a cursor that points past messages the files do not hold.
        ``now_ms``, if given, stamps the move like a schedule does (stamps never decrease).
        """
        cursor = Cursor(*cursor)
        invariant(cursor >= self._cursor,
                  f"cursor moved backwards from {tuple(self._cursor)} to {tuple(cursor)}")
        if now_ms is not None:
            self._stamp_ms = max(now_ms, self._stamp_ms)
        if cursor == self._cursor:
            return
        self._cursor = cursor
        self._scan_second = max(self._scan_second, cursor.second)
        for second in [s for s in self._passing if s < cursor.second]:
            del self._passing[second]
        cursor_hour = cursor.second // SECONDS_PER_HOUR
        for hour in sorted(h for h in self._dirty if h <= cursor_hour):
            segment = self._open[hour]
            self._forget_buffer(hour, segment)
            segment.flush()
        self._write_meta()
        if not self._replicated:
            self._delete_passed_hours()

    def rewind(self) -> None:
        """Start a new dispatch pass from the cursor (after a restart or a leader change)."""
        self._window.clear()
        self._skipped.clear()
        self._scan_second = self._cursor.second
        self._release_maps()

    def reset_to(self, cursor: Cursor, stamp_ms: int) -> None:
        """Set cursor and stamp as a restored snapshot has them (the only way back)."""
        self._cursor = Cursor(*cursor)
        self._stamp_ms = stamp_ms
        self._passing.clear()  # read from files the snapshot replaced
        self._write_meta()
        self.rewind()

    def drain_skipped(self) -> list[Cursor]:
        """Positions at or after the cursor that this pass went past without handing them out
        (cancelled or corrupt), since the last call. Only a ``replicated`` wheel records them:
        its dispatcher counts them as done when it works out how far the cursor may move."""
        skipped, self._skipped = self._skipped, []
        return skipped

    def live_tags_until(self, cursor: Cursor) -> dict[int, int]:
        """How many messages of each tag the cursor passes moving to ``cursor``: those at or
        after the cursor and before ``cursor`` that are not cancelled. A replicated state
        machine keeps per-tag pending counts with it, the same on every replica.

        Cost: one unit read per message passed, mostly ahead of time (`walk_ahead`); a second
        the cursor crosses in several steps is read once (its units are kept until the cursor
        leaves it), never per step.
        """
        counts: Counter[int] = Counter()
        second, local_index = self._cursor
        while (second, local_index) < cursor:
            hour = second // SECONDS_PER_HOUR
            segment = self._segment(hour, create=False)
            if segment is not None:
                units = self._units_of(segment, second)
                stop = cursor.local_index if second == cursor.second else len(units.tags)
                passed = units.global_indexes[local_index:stop]
                if segment.tombstones and not segment.tombstones.isdisjoint(passed):
                    tombstones = segment.tombstones
                    counts.update(tag for global_index, tag
                                  in zip(passed, units.tags[local_index:stop], strict=True)
                                  if global_index not in tombstones)
                else:  # nothing cancelled among them: counted in C
                    counts.update(units.tags[local_index:stop])
            following = self._next_occupied_second(second + 1)
            if following is None:
                break
            second, local_index = following, 0
        return dict(counts)

    def walk_ahead(self, max_units: int) -> None:
        """Read up to ``max_units`` index units of the next second the cursor will pass, so
        that the cursor command entering it finds them read: a second of 20,000 messages
        took 12 ms to read at once, a delivery stall on every replica once a second. The
        Raft thread calls this between turns; it reads nothing once that second is read."""
        second = self._cursor.second
        for _ in range(2):  # the cursor's second, then the next one holding messages
            hour = second // SECONDS_PER_HOUR
            segment = self._segment(hour, create=False)
            if segment is not None and segment.heads[((second % SECONDS_PER_HOUR) << 1) + 1]:
                units = self._passing_units(second)
                if units.resume != _WALKED:
                    self._walk(segment, second, units, max_units)
                    return
            following = self._next_occupied_second(second + 1)
            if following is None:
                return
            second = following

    def _units_of(self, segment: HourSegment, second: int) -> _SecondUnits:
        """The global index and tag of each message filed under ``second``, by local index:
        read to the end now if `walk_ahead` has not, and extended by what was filed since."""
        units = self._passing_units(second)
        self._walk(segment, second, units, max_units=segment.units)
        second_of_hour = second % SECONDS_PER_HOUR
        count = segment.heads[(second_of_hour << 1) + 1]
        if len(units.tags) < count:
            newer_globals, newer_tags = array("I"), array("H")
            segment.walk_chain(segment.heads[second_of_hour << 1], len(units.tags), count,
                               newer_globals, newer_tags)
            newer_globals.reverse()
            newer_tags.reverse()
            units.global_indexes += newer_globals
            units.tags += newer_tags
        invariant(len(units.tags) == count,
                  f"second {second} chains {len(units.tags)} units of {count}")
        return units

    def _walk(self, segment: HourSegment, second: int, units: _SecondUnits,
              max_units: int) -> None:
        """Walk on down the chain of ``second`` for up to ``max_units`` units; once at its
        end, the units are put in local index order."""
        if units.resume == _WALKED:
            return
        self._map_for_reading(segment)
        start = (segment.heads[(second % SECONDS_PER_HOUR) << 1] if units.resume is None
                 else units.resume)
        resume = segment.walk_chain(start, 0, max_units, units.global_indexes, units.tags)
        if resume < 0:
            units.global_indexes.reverse()
            units.tags.reverse()
            units.resume = _WALKED
        else:
            units.resume = resume

    def _passing_units(self, second: int) -> _SecondUnits:
        units = self._passing.get(second)
        if units is None:
            units = self._passing[second] = _SecondUnits()
        return units

    def _map_for_reading(self, segment: HourSegment) -> None:
        """Map ``segment`` for reading, once; `_release_maps` unmaps it when passed."""
        if segment.hour not in self._mapped:
            segment.map_for_reading()
            self._mapped.add(segment.hour)

    def count_at(self, second: int) -> int:
        """How many messages are filed under ``second`` (cancelled ones included)."""
        hour, second_of_hour = divmod(second, SECONDS_PER_HOUR)
        segment = self._segment(hour, create=False)
        return 0 if segment is None else segment.heads[(second_of_hour << 1) + 1]

    def next_occupied_second(self, from_second: int) -> int | None:
        """The first second at or after ``from_second`` holding a message, or None."""
        return self._next_occupied_second(from_second)

    def passed_hours(self) -> list[int]:
        """Hours still on disk that the cursor has passed (only a ``replicated`` wheel keeps
        them)."""
        return self._hours[:bisect.bisect_left(self._hours, self._cursor.second //
                                               SECONDS_PER_HOUR)]

    def delete_hour(self, hour: int) -> None:
        """Delete a passed hour's files."""
        invariant(hour < self._cursor.second // SECONDS_PER_HOUR,
                  f"deleting hour {hour}, which the cursor {tuple(self._cursor)} has not passed")
        self._remove_hour(hour)
        self._hours.remove(hour)

    def files(self) -> dict[str, int]:
        """Flush, then the append-only files of the hours at or after the cursor's, by path
        relative to the root, with their sizes. Heads and ``meta`` are not listed: heads are
        rebuilt from the index, and the cursor and stamp are properties."""
        self.flush()
        first = bisect.bisect_left(self._hours, self._cursor.second // SECONDS_PER_HOUR)
        listed = {}
        for hour in self._hours[first:]:
            for name, size in segment_files(self._hours_dir, hour).items():
                listed[f"{_HOURS_DIR}/{hour:08d}/{name}"] = size
        return listed

    def flush(self) -> None:
        """Write every buffered append to the segment files and the stamp to ``meta``."""
        for hour in sorted(self._dirty):
            self._open[hour].flush()  # dirty hours are always open: eviction flushes first
        self._dirty.clear()
        self._buffered_bytes = 0
        self._write_meta()

    def close(self) -> None:
        """Flush and release every file; the wheel cannot be used afterwards."""
        if self._lock_fd < 0:
            return
        self.flush()
        for segment in self._open.values():
            segment.close()
        self._open.clear()
        os.close(self._meta_fd)
        os.close(self._lock_fd)
        self._lock_fd = -1

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _segment(self, hour: int, *, create: bool) -> HourSegment | None:
        """The open segment of ``hour``; opened (or created, if ``create``) on demand."""
        segment = self._open.get(hour)
        if segment is not None:
            self._open.move_to_end(hour)
            return segment
        position = bisect.bisect_left(self._hours, hour)
        exists = position < len(self._hours) and self._hours[position] == hour
        if not exists:
            if not create:
                return None
            self._hours.insert(position, hour)
        self._evict()
        segment = HourSegment.open(self._hours_dir, hour)
        self._open[hour] = segment
        return segment

    def _evict(self) -> None:
        """Make room for one more segment within ``max_open_hours`` by closing the least
        recently used, sparing the hours the dispatch window reads from (which may exceed the
        limit for as long as the window needs them)."""
        excess = len(self._open) + 1 - self._max_open_hours
        if excess <= 0:
            return
        low = (self._window[0][0] if self._window else self._scan_second) // SECONDS_PER_HOUR
        high = self._scan_second // SECONDS_PER_HOUR
        for hour in [h for h in self._open if not low <= h <= high][:excess]:
            segment = self._open.pop(hour)
            self._forget_buffer(hour, segment)
            self._mapped.discard(hour)
            segment.close()

    def _forget_buffer(self, hour: int, segment: HourSegment) -> None:
        """Stop counting ``segment``'s buffered appends: it is about to write or drop them."""
        if hour in self._dirty:
            self._buffered_bytes -= segment.buffered_bytes
            self._dirty.discard(hour)

    def _next_occupied_second(self, from_second: int) -> int | None:
        """The first second at or after ``from_second`` holding a message: hour wheel first,
        then the occupancy bits of one hour; empty hours and seconds are skipped, not visited."""
        first_hour = from_second // SECONDS_PER_HOUR
        for position in range(bisect.bisect_left(self._hours, first_hour), len(self._hours)):
            hour = self._hours[position]
            segment = self._segment(hour, create=False)
            start = max(0, from_second - hour * SECONDS_PER_HOUR)
            bits = segment.occupied >> start
            if bits:
                return hour * SECONDS_PER_HOUR + start + (bits & -bits).bit_length() - 1
        return None

    def _load_until(self, limit_second: int, enough_msgs: int) -> None:
        """Load the chains of occupied seconds up to ``limit_second`` into the window, one hour
        at a time, until it holds ``enough_msgs`` units (at most ``max_window_msgs``): the
        window stays small, and so do its heap operations, however large the backlog."""
        cap = self._config.max_window_msgs
        enough_msgs = min(enough_msgs, cap)
        while self._scan_second <= limit_second and len(self._window) < enough_msgs:
            second = self._next_occupied_second(self._scan_second)
            if second is None or second > limit_second:
                self._scan_second = limit_second + 1
                return
            self._load_hour(second, limit_second, enough_msgs)

    def _load_hour(self, first_second: int, limit_second: int, enough_msgs: int) -> None:
        """Load the occupied seconds of ``first_second``'s hour from it up to ``limit_second``,
        second by second until the window holds ``enough_msgs``, or in one index scan when the
        span holds most of the hour's units and fits under ``max_window_msgs``."""
        hour = first_second // SECONDS_PER_HOUR
        segment = self._segment(hour, create=False)
        self._map_for_reading(segment)
        last_second = min(limit_second, (hour + 1) * SECONDS_PER_HOUR - 1)
        base_second = hour * SECONDS_PER_HOUR
        window = self._window
        span_units = segment.units_between(first_second - base_second,
                                           last_second - base_second)
        if 2 * span_units >= segment.units and (
                len(window) + span_units <= self._config.max_window_msgs):
            self._load_span(segment, first_second, last_second)
            self._scan_second = last_second + 1
            return
        bits = segment.occupied >> (first_second - base_second)
        bits &= (1 << (last_second - first_second + 1)) - 1
        second = first_second
        while bits and len(window) < enough_msgs:
            skip = (bits & -bits).bit_length() - 1
            second += skip
            self._load_second(segment, second)
            bits >>= skip + 1
            second += 1
            self._scan_second = second
        if not bits:
            self._scan_second = last_second + 1

    def _load_second(self, segment: HourSegment, slot: int) -> None:
        done_below = self._cursor.local_index if slot == self._cursor.second else 0
        tombstones = segment.tombstones
        base = segment.hour << _GLOBAL_INDEX_BITS
        window = self._window
        for offset, size, local_index, global_index, _, deliver_at_ms, _, _ in segment.chain(
                slot % SECONDS_PER_HOUR):
            if local_index < done_below:
                break
            if global_index not in tombstones:
                heapq.heappush(window, (slot, deliver_at_ms, local_index, base | global_index,
                                        offset, size))
            else:
                self._skip(slot, local_index)

    def _load_span(self, segment: HourSegment, first_second: int, last_second: int) -> None:
        """Load every unit filed under ``first_second..last_second`` with one index scan."""
        base_second = segment.hour * SECONDS_PER_HOUR
        cursor, tombstones = self._cursor, segment.tombstones
        base = segment.hour << _GLOBAL_INDEX_BITS
        loaded = [
            (slot, deliver_at_ms, local_index, base | global_index, offset, size)
            for offset, size, local_index, global_index, _, deliver_at_ms, second_of_hour, _
            in segment.scan()
            if first_second <= (slot := base_second + second_of_hour) <= last_second
            and (slot, local_index) >= cursor
        ]
        if tombstones:
            for slot, _, local_index, handle, _, _ in loaded:
                if handle & _GLOBAL_INDEX_MASK in tombstones:
                    self._skip(slot, local_index)
            loaded = [entry for entry in loaded
                      if entry[3] & _GLOBAL_INDEX_MASK not in tombstones]
        window = self._window  # changed in place: callers hold the list
        if len(loaded) * 8 < len(window):
            for entry in loaded:
                heapq.heappush(window, entry)
        else:
            window += loaded
            heapq.heapify(window)

    def _skip_corrupt(self, segment: HourSegment, entry: _WindowEntry,
                      error: CorruptSegment) -> None:
        """A record failed its CRC: count it and say so loudly; it is never handed out."""
        slot, _, local_index, handle, offset, _ = entry
        self.corrupt_records_skipped += 1
        log.error("event=record_corrupt file=%s offset=%d handle=%d slot_second=%d "
                  "local_index=%d error=%r", segment.path / "log", offset, handle, slot,
                  local_index, str(error))

    def _drop_stale_top(self) -> None:
        window = self._window
        while window:
            slot, _, local_index, handle, _, _ = window[0]
            segment = self._segment(handle >> _GLOBAL_INDEX_BITS, create=False)
            if (slot, local_index) < self._cursor or segment is None:
                heapq.heappop(window)
                continue
            if handle & _GLOBAL_INDEX_MASK not in segment.tombstones:
                return
            heapq.heappop(window)
            self._skip(slot, local_index)

    def _release_maps(self) -> None:
        """Unmap hours the dispatch has left behind."""
        low = (self._window[0][0] if self._window else self._scan_second) // SECONDS_PER_HOUR
        for hour in [h for h in self._mapped if h < low]:
            self._mapped.discard(hour)
            if hour in self._open:
                self._open[hour].unmap()

    def _delete_passed_hours(self) -> None:
        passed = bisect.bisect_right(self._hours, self._cursor.second // SECONDS_PER_HOUR - 1)
        for hour in self._hours[:passed]:
            self._remove_hour(hour)
        del self._hours[:passed]

    def _remove_hour(self, hour: int) -> None:
        segment = self._open.pop(hour, None)
        if segment is not None:
            self._forget_buffer(hour, segment)
            segment.discard()
        self._mapped.discard(hour)
        remove_segment(self._hours_dir, hour)
        log.info("event=hour_deleted hour=%d cursor_second=%d", hour, self._cursor.second)

    def _skip(self, slot: int, local_index: int) -> None:
        if self._replicated:
            self._skipped.append(Cursor(slot, local_index))

    def _write_meta(self) -> None:
        """Overwrite the older of the two meta copies: one ``pwrite``, no rename."""
        self._meta_sequence += 1
        os.pwrite(self._meta_fd, pack_meta(self._meta_sequence, *self._cursor, self._stamp_ms),
                  self._meta_sequence % META_COPIES * META.size)


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


_WALKED = -1
"""`_SecondUnits.resume` once the whole chain is read."""


@dataclass(slots=True)
class _SecondUnits:
    """The units of a second the cursor is about to pass: the global index and tag of each
    (6 bytes a message). While `Wheel.walk_ahead` reads the chain in steps they are newest
    first and ``resume`` names the next unit to read (None before the first step); once
    read (``resume`` is `_WALKED`) they are in local index order."""

    global_indexes: array = field(default_factory=lambda: array("I"))
    tags: array = field(default_factory=lambda: array("H"))
    resume: int | None = None


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
