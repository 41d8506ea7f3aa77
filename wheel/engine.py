"""The two-level wheel over hour segments: scheduling, cancelling, taking what is due, the cursor.

See the package docstring (`tickwheel.wheel`) for the algorithm, its costs and a worked example.
`Wheel` owns the cursor, the stamp and the ``meta`` file, and composes the parts it delegates
to: `HourSet` (the hours on disk and the open segments), `DueWindow` (the preload window) and
`CursorPassage` (what the cursor passes, by tag); `Handles` reads and cancels by handle.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tickwheel.common.errors import (
    InvalidMessage,
    invariant,
)
from tickwheel.wheel.due import DueHistogram, due_histogram
from tickwheel.wheel.filing import file_records
from tickwheel.wheel.format import (
    SECONDS_PER_HOUR,
    encode_record,
)
from tickwheel.wheel.handles import Handles
from tickwheel.wheel.hours import HourSet
from tickwheel.wheel.mending import CopySource, MendCounts, Mender
from tickwheel.wheel.meta import MetaFile
from tickwheel.wheel.passage import CursorPassage
from tickwheel.wheel.types import CancelResult, Cursor, DueMessage, NewMessage, WheelConfig
from tickwheel.wheel.window import DueWindow

log = logging.getLogger("tickwheel.wheel")


class Wheel:
    """A durable delayed-message store that hands messages out in due order.

    Single-threaded: one owner calls every method. Time comes in as arguments (``now_ms``);
    the wheel never reads a clock. Use `Wheel.open` and close it (or use it as a context manager).
    """

    def __init__(self, config: WheelConfig, meta: MetaFile, cursor: Cursor, stamp_ms: int,
                 hours: HourSet) -> None:
        self._config = config
        self._meta = meta
        self._cursor, self._stamp_ms = cursor, stamp_ms
        self._hours = hours
        self._window = DueWindow(hours, config, self._cursor.second, self._skip)
        self._passage = CursorPassage(hours)
        self.handles = Handles(hours, lambda: self._cursor)
        """Reading, cancelling and tombstoning by handle (`Handles`)."""
        self._skipped: list[Cursor] = []

    @classmethod
    def open(cls, root: Path | str, config: WheelConfig | None = None, *,
             copies: CopySource | None = None,
             mend_counts: MendCounts | None = None) -> Wheel:
        """Open the wheel stored under ``root`` (created if absent).

        Cost: one directory listing and the ``meta`` file; hour segments open lazily, each from
        its heads checkpoint. Raises `StorageLocked` if another process has it open.

        The wheel is the state machine of a Raft log, so its owner decides when files go:
        hours the cursor has passed stay on disk until `delete_hour` (a snapshot may still name
        them), and positions passed over without being handed out are kept for `drain_skipped`.

        ``copies`` is where a damaged record, unit or tombstone finds a good copy (see
        `tickwheel.wheel.mending`): the other replicas' files; what
        mending did is added to ``mend_counts`` (a new one if None; see `mended`).
        """
        root = Path(root)
        config = config or WheelConfig()
        hours = HourSet.open(root, config.max_open_hours, Mender(root, copies, mend_counts))
        meta, cursor, stamp_ms = MetaFile.open(root)
        hours.tag_hours.rebuild(hours.dir, hours.hours[bisect.bisect_left(
            hours.hours, cursor.second // SECONDS_PER_HOUR):])
        wheel = cls(config, meta, cursor, stamp_ms, hours)
        log.info("event=wheel_opened root=%s hours=%d cursor_second=%d cursor_local_index=%d",
                 root, len(hours.hours), cursor.second, cursor.local_index)
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
    def corrupt_records_skipped(self) -> int:
        """Records damaged beyond mending when handed out (each logged; none handed out)."""
        return self._window.corrupt_records_skipped

    @property
    def mended(self) -> MendCounts:
        """Damaged units and records mended from copies, and those no copy could replace."""
        return self._hours.mender.counts

    @property
    def damage_held(self) -> str | None:
        """Why the last `take_due` stopped short of what was due: a damaged record or unit
        whose copies could not all be asked. Nothing after it was taken; ask again later."""
        return self._window.held

    @property
    def walking(self) -> int:
        """Chains begun and not read to their end: seconds too large for one take (`WheelConfig.
        max_load_units`), read as the dispatch takes them, and passed-over units of tags no
        longer parked (`park`)."""
        return self._window.walking

    @property
    def parked(self) -> frozenset[int]:
        """The tags whose messages `take_due` passes over (`park`)."""
        return self._window.parked

    def park(self, tags: frozenset[int]) -> None:
        """Pass over the messages of ``tags`` from now on, in this dispatch pass: they stay in
        the wheel, not in memory, neither taken nor skipped (so no cursor passes them); once
        a tag is no longer among ``tags``, what was passed over of it is read again and
        taken, each when due."""
        self._window.park(tags)

    @property
    def window_msgs(self) -> int:
        """Index units held in memory by the preload window."""
        return len(self._window)

    @property
    def hours(self) -> list[int]:
        """The hour wheel: hours (``slot_second // 3600``) that have a segment, ascending."""
        return list(self._hours.hours)

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
        if tags is None:
            tags = [0] * len(records)
        handles = file_records(self._hours, self._window, self._cursor, stamp_ms,
                               records, deliver_at_ms, tags)
        if self._hours.buffered_bytes > self._config.max_buffered_bytes:
            self.flush()
        return handles

    def cancel(self, handle: int) -> CancelResult:
        """Tombstone the message ``handle`` names, and say what that did (`CancelResult`;
        `Handles.cancel_tag` has the rules). Raises `UnknownHandle` for a handle never
        returned."""
        return self.handles.cancel_tag(handle)[0]

    def next_due_ms(self) -> int | None:
        """When the next message is due, or None if nothing is pending ahead of the dispatch.

        Exact for seconds already loaded; for a second beyond the preload window it is the
        start of that second (early by under a second, never late). An arrival that is due
        earlier changes the answer. Cost: O(1) plus one skip per empty hour, never per empty
        second.
        """
        return self._window.next_due_ms(self._cursor)

    def take_due(self, now_ms: int, max_msgs: int, share_msgs: int = 0) -> list[DueMessage]:
        """Hand out up to ``max_msgs`` messages due at ``now_ms``, in dispatch order (but for
        a second too large for one take, whose messages go as they are read, and the parked
        tags' messages, which go once their tag is taken again). With ``share_msgs``, one
        tag (a topic) gets at most that many before the other tags' due messages, and the
        room they leave (`DueWindow.take`).

        A message is handed out once per dispatch pass; `rewind` starts a new pass from the
        cursor. Cancelled messages and messages behind the cursor are never handed out. Reading
        the body happens here, not before.
        """
        invariant(max_msgs > 0, f"take_due max_msgs={max_msgs}")
        taken = self._window.take(now_ms, max_msgs, self._cursor, share_msgs)
        self._release_maps()
        return taken

    def advance_cursor(self, cursor: Cursor, now_ms: int | None = None) -> None:
        """Move the cursor forward (never back); the hours it passes stay until `delete_hour`.

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
        self._window.scan_second = max(self._window.scan_second, cursor.second)
        self._passage.forget_before(cursor.second)
        cursor_hour = cursor.second // SECONDS_PER_HOUR
        self._hours.flush_through(cursor_hour)
        self._write_meta()
        self._hours.tag_hours.forget_before(cursor_hour)

    def rewind(self) -> None:
        """Start a new dispatch pass from the cursor (after a restart or a leader change)."""
        self._window.rewind(self._cursor.second)
        self._skipped.clear()
        self._release_maps()

    def reset_to(self, cursor: Cursor, stamp_ms: int) -> None:
        """Set cursor and stamp as a restored snapshot has them (the only way back)."""
        cursor_hour = cursor.second // SECONDS_PER_HOUR
        if cursor_hour < self._cursor.second // SECONDS_PER_HOUR:  # hours not counted yet
            self._hours.flush()
            self._hours.tag_hours.rebuild(self._hours.dir, self._hours.hours[bisect.bisect_left(
                self._hours.hours, cursor_hour):])
        self._hours.tag_hours.forget_before(cursor_hour)
        self._cursor = Cursor(*cursor)
        self._stamp_ms = stamp_ms
        self._passage.clear()  # read from files the snapshot replaced
        self._write_meta()
        self.rewind()

    def drain_skipped(self) -> list[Cursor]:
        """Positions at or after the cursor that this pass went past without handing them out
        (cancelled or corrupt), since the last call or `rewind`: the dispatcher counts them as
        done when it works out how far the cursor may move."""
        skipped, self._skipped = self._skipped, []
        return skipped

    def live_tags_until(self, cursor: Cursor) -> dict[int, int]:
        """How many messages of each tag the cursor passes moving to ``cursor``: those at or
        after the cursor and before ``cursor`` that are not cancelled (`CursorPassage`: one
        unit read per message passed, mostly ahead of time by `walk_ahead`)."""
        return self._passage.live_tags_between(self._cursor, cursor)

    def due_histogram(self, start_second: int, bucket_seconds: int, buckets: int,
                      tag: int | None = None) -> DueHistogram:
        """Live messages from the cursor on, in ``buckets`` buckets of ``bucket_seconds`` from
        ``start_second`` (`tickwheel.wheel.due`: from counts, no chain read; any thread);
        with ``tag``, that tag's alone (`tickwheel.wheel.tag_hours`)."""
        return due_histogram(self._hours, self._cursor, start_second, bucket_seconds, buckets,
                             tag)

    def walk_ahead(self, max_units: int, now_ms: int | None = None) -> None:
        """Read up to ``max_units`` index units of the seconds the cursor will pass next, so
        that the cursor command entering one finds it read (`CursorPassage`); with
        ``now_ms``, only once they are due within ``AHEAD_SECONDS`` of it. The Raft thread
        calls this between turns."""
        self._passage.walk_ahead(self._cursor.second, max_units,
                                 None if now_ms is None else now_ms // 1000)

    @property
    def passage_units_read(self) -> int:
        """Index units `walk_ahead` and the cursor's passage read since the wheel opened."""
        return self._passage.units_read

    def count_at(self, second: int) -> int:
        """How many messages are filed under ``second`` (cancelled ones included)."""
        return self._hours.count_at(second)

    def next_occupied_second(self, from_second: int) -> int | None:
        """The first second at or after ``from_second`` holding a message, or None."""
        return self._hours.next_occupied_second(from_second)

    def passed_hours(self) -> list[int]:
        """Hours still on disk that the cursor has passed."""
        return self._hours.before(self._cursor.second // SECONDS_PER_HOUR)

    def delete_hour(self, hour: int) -> None:
        """Delete a passed hour's files."""
        invariant(hour < self._cursor.second // SECONDS_PER_HOUR,
                  f"deleting hour {hour}, which the cursor {tuple(self._cursor)} has not passed")
        self._hours.delete(hour, self._cursor.second)

    def lengths(self, from_hour: int | None = None) -> dict[str, int]:
        """The append-only files of the hours at or after the cursor's (or ``from_hour``, when
        earlier: messages behind the cursor still in use), by path relative to the root, with
        the lengths they have once every buffered append is written; those not empty. Read
        from memory, without writing or reading a file: what a snapshot names
        (`unflushed_hours` and `flush_hour` then write the bytes it names, a few hours at a
        time). Heads and ``meta`` are not listed: heads are rebuilt from the index, and the
        cursor and stamp are properties."""
        first_hour = self._cursor.second // SECONDS_PER_HOUR
        return self._hours.lengths(first_hour if from_hour is None else min(from_hour,
                                                                            first_hour))

    def unflushed_hours(self) -> list[int]:
        """The hours with appends buffered, not yet written to their files."""
        return self._hours.unflushed()

    def flush_hour(self, hour: int) -> None:
        """Write the appends buffered for ``hour``, if any (its heads checkpoint too)."""
        self._hours.flush_hour(hour)

    def flush(self) -> None:
        """Write every buffered append to the segment files and the stamp to ``meta``."""
        self._hours.flush()
        self._write_meta()

    def close(self) -> None:
        """Flush and release every file; the wheel cannot be used afterwards."""
        if self._meta.closed:
            return
        self.flush()
        self._hours.close()
        self._meta.close()

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _release_maps(self) -> None:
        """Unmap hours the dispatch has left behind."""
        self._hours.release_maps(self._window.hours_in_use()[0])

    def _skip(self, slot: int, local_index: int) -> None:
        self._skipped.append(Cursor(slot, local_index))

    def _write_meta(self) -> None:
        self._meta.write(self._cursor, self._stamp_ms)
