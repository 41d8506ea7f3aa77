"""The preload window: the index units of the seconds about to come due, in dispatch order.

The scan walks the occupied seconds ahead of the dispatch (``scan_second`` is the first it has
not started) and pushes each unit onto a queue ordered by ``(slot_second, deliver_at_ms,
local_index)``: dispatch order (a `RunHeap`: messages filed in due order cost it one comparison
each). A message filed for a second the scan has passed goes straight onto the queue, unless
its tag is parked or it would fill the queue past its bound (`add_filed`). Loading
stops at ``max_window_msgs`` units, or at the preload horizon; a span that holds most of an
hour's units is read in one index scan instead of chain by chain.

A second's chain is read whole unless it holds more than a take may read
(`WheelConfig.max_load_units`): then the rest of it becomes a *walk* (`Walk`), read a take's
share at a time and only as fast as the dispatch takes it, and the scan goes on to the next
seconds. So a million messages due at once never sit in memory whole, and the messages due
after them are not held behind them; within such a second messages go out in the order they
are read (newest filed first), each when due. In a fair take, that walk passes over the units
of the tags that have a backlog (`chains.Passing`), which walks of their own read as fast as
they are taken: the other tags' messages filed into a burst's second before it (at the end
of its chain) wait for half a take's reading a take, not for the whole burst.

*Parked* tags (`DueWindow.park`: the dispatcher's topics whose consumers are behind) are passed
over: their units stay in the wheel, not in memory; the window keeps, per tag and second, the
stretches of the chain where it passed them over, and walks those again for that tag's units
once it is no longer parked (what was on the queue already waits aside). A parked message is
neither taken nor skipped, so no cursor passes it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Sequence

from tickwheel.common.runheap import RunHeap
from tickwheel.wheel import chains
from tickwheel.wheel.chains import (
    ALL_TAGS,
    GLOBAL_INDEX_BITS,
    GLOBAL_INDEX_MASK,
    Walk,
    WindowEntry,
)
from tickwheel.wheel.format import MS_PER_SECOND, SECONDS_PER_HOUR
from tickwheel.wheel.hours import HourSet
from tickwheel.wheel.mending import Unmended
from tickwheel.wheel.segment import HourSegment
from tickwheel.wheel.shares import Shares
from tickwheel.wheel.types import Cursor, DueMessage, WheelConfig

log = logging.getLogger("tickwheel.wheel")

_new = tuple.__new__
"""A namedtuple's own constructor is a Python call per message."""


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
        self._budget = 0
        """Units the current take may still read from chains."""
        self._walked = 0
        """Units the current take's walks put onto the queue (a take without shares counts
        the backlogs it puts back in order too)."""
        self._walked_own = 0
        """Of them, what walks of one tag put there."""
        self._now_ms = 0
        """The current take's time."""
        self.corrupt_records_skipped = 0
        self.held: str | None = None
        """Why the last `take` stopped at damage it could not mend yet (None: it did not)."""
        self.passing = chains.Passing()
        """The parked and following tags, and where the walks passed over their units."""
        self._aside: dict[int, list[WindowEntry]] = {}
        """tag -> entries taken off the queue while the tag is parked (loaded before it was),
        each a heap: its first entry is its oldest, which `hours_in_use` reads every take."""
        self._walks: list[Walk] = []
        """Chains to read on, oldest second first: long seconds the scan started, and the
        units passed over of following tags and of tags no longer parked."""
        self._segment: HourSegment | None = None
        """The hour segment the take read last."""
        self.shares = Shares(config.max_load_units)
        """The backlogs of fair takes (`take` with ``share_msgs``)."""
        hours.in_use = self.hours_in_use

    def __len__(self) -> int:
        return len(self.queue) + len(self.shares)

    @property
    def parked(self) -> frozenset[int]:
        return self.passing.parked

    def hours_in_use(self) -> tuple[int, int]:
        """The first and last hour the window reads from."""
        first = self.queue.first()
        seconds = [first[0] if first is not None else self.scan_second]
        seconds += self.passing.seconds()
        seconds += [entries[0][0] for entries in self._aside.values()]
        seconds += [entry[0] for entry in self.shares.firsts()]
        if self._walks:
            seconds.append(self._walks[0].second)
        return min(seconds) // SECONDS_PER_HOUR, self.scan_second // SECONDS_PER_HOUR

    @property
    def walking(self) -> int:
        """Chains begun and not read to their end (long seconds, tags taken again)."""
        return len(self._walks)

    def rewind(self, cursor_second: int) -> None:
        """Forget everything loaded; scan again from ``cursor_second`` (which passes over the
        parked tags' units again)."""
        self.queue.clear()
        self.shares.clear()
        self.passing.clear()
        self._aside.clear()
        self._walks.clear()
        self.scan_second = cursor_second

    def park(self, tags: frozenset[int]) -> None:
        """Pass over the units of ``tags`` from now on; read again what was passed over of
        the tags no longer among them."""
        if tags == self.parked:
            return
        resumed = self.parked - tags
        self._walks = self.passing.park(self._walks, tags)
        for tag in resumed & self._aside.keys():
            self.queue.extend(self._aside.pop(tag))

    def add_filed(self, slots: list[int], deliver_at_ms: Sequence[int],
                  records: Sequence[bytes], local_indexes: list[int], first_handle: int,
                  offset: int, tags: Sequence[int]) -> None:
        """Put the messages just filed in one hour that are due before the scan second onto
        the queue (the scan has passed their seconds), but a parked tag's: those stay in the
        wheel, passed over (`chains.leave_filed`). Past ``max_window_msgs``, the window first
        forgets what it loaded of the seconds after the last take's (none of them taken yet)
        and scans them again; what would still fill it, filed into a second a take reached
        that now holds more than ``max_load_units``, stays in the wheel as walks of its tags:
        a burst filed under a second before it is due is not held whole either."""
        max_msgs, parked = self._config.max_window_msgs, self.parked
        long_units: int | None = None
        if len(self) + len(slots) > max_msgs:  # else all fit
            late = [slot for slot in slots if slot < self.scan_second]
            if len(self) + len(late) > max_msgs:
                self._forget_from(max(min(late), self._now_ms // MS_PER_SECOND + 1))
                if len(self) + sum(s < self.scan_second for s in slots) > max_msgs:
                    long_units = self._config.max_load_units
        left: set[int] = set()
        if long_units is not None or (parked and not parked.isdisjoint(tags)):
            segment = self._hours.existing(first_handle >> GLOBAL_INDEX_BITS)
            left = chains.leave_filed(segment, self.passing, self._walks,
                                      first_handle & GLOBAL_INDEX_MASK, slots, tags,
                                      self.scan_second, long_units)
        scan_second, push = self.scan_second, self.queue.push
        for i, (slot, due_ms, record) in enumerate(zip(slots, deliver_at_ms, records,
                                                       strict=True)):
            if slot < scan_second and slot not in left and tags[i] not in parked:
                push((slot, due_ms, local_indexes[i], first_handle + i, offset, len(record),
                      tags[i]))
            offset += len(record)

    def _forget_from(self, second: int) -> None:
        """Forget what was loaded of ``second`` and later (which no take has reached: they
        are after the last take's second) and scan again from there."""
        if second < self.scan_second:
            self.queue.keep(lambda entry: entry[0] < second)
            self._walks = [walk for walk in self._walks if walk.second < second]
            self.passing.forget_from(second)
            self.scan_second = second

    def take(self, now_ms: int, max_msgs: int, cursor: Cursor, share_msgs: int = 0
             ) -> list[DueMessage]:
        """Pop up to ``max_msgs`` messages due at ``now_ms`` (see `Wheel.take_due`), loading
        as needed, and read their bodies. Damage that may yet be mended (`Unmended`, not
        everywhere) stops the take there, and is kept in ``held``: what lies behind it is
        neither taken nor skipped, so no cursor passes it. A record damaged everywhere is
        skipped (and counted): no copy of it exists any more.

        With ``share_msgs``, a fair take (`tickwheel.wheel.shares`): each tag gets at most
        ``share_msgs`` before the other tags' due messages, and then the room they leave."""
        self.held = None
        self._budget = self._config.max_load_units
        self._walked = 0 if share_msgs else len(self.shares)
        self._walked_own = 0
        self._now_ms = now_ms
        taken: list[DueMessage] = []
        self.shares.begin()
        # a second's chain runs newest first: the walk of every tag passes over a backlog's
        # units (and a tag's walking again), so that what other tags filed there before the
        # burst is not read only after it; the tag's own walks read them, as it is taken
        self._walks = self.passing.follow(
            self._walks, frozenset(self.shares.heavy) if share_msgs else frozenset())
        if not share_msgs:
            self.queue.extend(self.shares.drain())  # backlogs of fair takes: in order again
            self._take(self.queue, now_ms, max_msgs, cursor, taken)
            return taken
        for side in self.shares.in_turn():  # each backlog its share first
            if self.held is None:
                self._take(side, now_ms, min(max_msgs, len(taken) + share_msgs), cursor, taken)
        if self.held is None:
            self._take(self.queue, now_ms, max_msgs, cursor, taken, share_msgs)
        for side in self.shares.in_turn():  # then the room the others left
            if self.held is None and len(taken) < max_msgs:
                self._take(side, now_ms, max_msgs, cursor, taken)
        self.shares.drop_empty()
        return taken

    def _take(self, source: RunHeap[WindowEntry], now_ms: int, max_msgs: int, cursor: Cursor,
              taken: list[DueMessage], share_msgs: int = 0) -> None:
        """Pop ``source`` into ``taken`` until it holds ``max_msgs``, loading as needed when
        ``source`` is the window's queue. With ``share_msgs``, a tag that has had its share
        of ``taken`` is a backlog: its entries go to its own queue (`Shares.defer`)."""
        limit_second = (now_ms + self._config.preload_ms) // MS_PER_SECOND
        now_second = now_ms // MS_PER_SECOND
        queue = self.queue
        parked = self.parked
        shares = self.shares
        counts: dict[int, int] = {}
        self._segment = None
        while len(taken) < max_msgs:
            # walks read older seconds than what the queue may hold ahead: read them on too,
            # once due (a second not due yet is read on as it is taken, not ahead of it)
            if source is queue and (not queue or self._reads_walk(now_ms, max_msgs)):
                if not self._fill(limit_second, max_msgs - len(taken), cursor) or not queue:
                    break
                self._segment = None
            if not source:
                break
            entry = source.pop()
            slot, deliver_at_ms, local_index, _, _, _, tag = entry
            if deliver_at_ms > now_ms or slot > now_second:
                source.unpop(entry)
                break
            if (slot, local_index) < cursor:
                continue
            if tag in parked:
                heapq.heappush(self._aside.setdefault(tag, []), entry)
                continue
            if share_msgs:
                count = counts.get(tag, 0)
                if count >= share_msgs or tag in shares.heavy:
                    if not shares.defer(tag, entry):
                        source.unpop(entry)
                        break
                    continue
                counts[tag] = count + 1
            if not self._read(entry, taken):
                source.unpop(entry)
                break

    def _read(self, entry: WindowEntry, taken: list[DueMessage]) -> bool:
        """Read ``entry``'s record into ``taken``, or skip it (cancelled; damaged on every
        copy); False when damage that may yet be mended stops the take (kept in ``held``)."""
        slot, _, local_index, handle, offset, size, _ = entry
        hour = handle >> GLOBAL_INDEX_BITS
        segment = self._segment
        if segment is None or segment.hour != hour:
            segment = self._segment = self._hours.existing(hour)
        if handle & GLOBAL_INDEX_MASK in segment.tombstones:
            self._on_skip(slot, local_index)
            return True
        try:
            fields = segment.record(offset, size)
        except Unmended as error:
            if not error.everywhere:
                self.held = str(error)
                return False
            self.corrupt_records_skipped += 1  # no copy of it is left: never handed out
            log.error("event=record_corrupt file=%s offset=%d handle=%d slot_second=%d "
                      "local_index=%d error=%r", segment.path / "log", offset, handle, slot,
                      local_index, str(error))
            self._on_skip(slot, local_index)
            return True
        taken.append(_new(DueMessage, (*fields[:5], handle, slot, local_index, fields[5])))
        return True

    def _reads_walk(self, now_ms: int, max_msgs: int) -> bool:
        """Whether the take reads on the first walk (older seconds than what the queue may
        hold ahead): a take's worth, once its second has come and what it read last is
        due (messages of such a second go in the order they are read)."""
        if not self._walks or not self._budget or self._walked >= max_msgs:
            return False
        walk = self._walks[0]
        return max(walk.second * MS_PER_SECOND, walk.due_ms) <= now_ms

    def _fill(self, limit_second: int, wanted: int, cursor: Cursor) -> bool:
        """Load for a take (`load_until`); False when there is nothing to load, or damage
        that may yet be mended stopped it (kept in ``held``)."""
        if not self.queue and self.scan_second > limit_second and not self._walks:
            return False
        try:
            self.load_until(limit_second, wanted, cursor)
        except Unmended as damage:
            if damage.everywhere:
                raise
            self.rewind(cursor.second)  # the load stopped part way: start it again
            self.held = str(damage)
            return False
        return True

    def next_due_ms(self, cursor: Cursor) -> int | None:
        """When the next message is due (see `Wheel.next_due_ms`)."""
        self.drop_stale_top(cursor)
        starts = [max(first[1], first[0] * MS_PER_SECOND)
                  for first in (self.queue.first(), *self.shares.firsts()) if first is not None]
        if self._walks:  # what a walk has not read may be due once it reads on
            walk = self._walks[0]
            starts.append(max(walk.second * MS_PER_SECOND, walk.due_ms))
        if (trailing := self.passing.first_trailing()) is not None:  # walks from the next take
            starts.append(trailing * MS_PER_SECOND)
        if starts:
            return min(starts)
        second = self._hours.next_occupied_second(self.scan_second)
        return None if second is None else second * MS_PER_SECOND

    def drop_stale_top(self, cursor: Cursor) -> None:
        """Pop entries behind the cursor, of deleted hours, or cancelled since loaded."""
        queue = self.queue
        while (first := queue.first()) is not None:
            slot, _, local_index, handle, _, _, _ = first
            segment = self._hours.segment(handle >> GLOBAL_INDEX_BITS, create=False)
            if (slot, local_index) < cursor or segment is None:
                queue.pop()
                continue
            if handle & GLOBAL_INDEX_MASK not in segment.tombstones:
                return
            queue.pop()
            self._on_skip(slot, local_index)

    def load_until(self, limit_second: int, enough_msgs: int, cursor: Cursor) -> None:
        """Read on the walks (with half the take's ``max_load_units`` first), then load the
        chains of occupied seconds up to ``limit_second``, one hour at a time, until the queue
        holds ``enough_msgs`` units (at most ``max_window_msgs``): the queue stays small, and
        so do its operations, however large the backlog. Walks get what is left of the
        budget. A take's walks put at most ``enough_msgs`` units onto the queue."""
        enough_msgs = min(enough_msgs, self._config.max_window_msgs)
        if self._walks:
            self._walk(enough_msgs, cursor, self._budget // 2)
        while (self.scan_second <= limit_second and len(self.queue) < enough_msgs
               and self._budget):
            second = self._hours.next_occupied_second(self.scan_second)
            if second is None or second > limit_second:
                self.scan_second = limit_second + 1
                break
            if not self._load_hour(second, limit_second, enough_msgs, cursor):
                break
        if self._walks and self._budget:
            self._walk(enough_msgs, cursor, self._budget)

    def _walk(self, enough_msgs: int, cursor: Cursor, budget: int) -> None:
        """Read on the walks, oldest second first, with ``budget`` units of the take's, until
        this take's walks have put ``enough_msgs`` units onto the queue; a walk read to its
        end is done."""
        self._budget -= budget
        following = self.passing.following
        for walk in self._walks:
            room = self._config.max_window_msgs - len(self.queue)
            if budget <= 0 or room <= 0:
                break
            own = walk.tag != ALL_TAGS
            part = (budget + 1) // 2 if following and not own else budget
            if own:  # what the tag's backlog holds is read already
                room = min(room, enough_msgs - self._walked_own
                           - len(self.shares.heavy.get(walk.tag, ())))
            else:  # the walks of one tag get the rest of the budget and their own room
                room = min(room, enough_msgs - (self._walked - self._walked_own))
            if room <= 0:
                continue
            segment = self._hours.existing(walk.second // SECONDS_PER_HOUR)
            self._hours.map_for_reading(segment)
            left, pushed = self._read_chain(segment, walk, cursor, part, room)
            budget -= part - left
            self._walked += pushed
            self._walked_own += pushed if own else 0
        self._walks = [walk for walk in self._walks if not walk.done]
        self._budget += budget

    def _load_hour(self, first_second: int, limit_second: int, enough_msgs: int,
                   cursor: Cursor) -> bool:
        """Load the occupied seconds of ``first_second``'s hour from it up to ``limit_second``,
        second by second until the queue holds ``enough_msgs`` or the take's budget runs out,
        or in one index scan when the span holds most of the hour's units and fits under
        ``max_window_msgs`` and what is left of the take's ``max_load_units``. False when it
        stopped at a second that waits for the next take (`_load_second`)."""
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
            self.queue.extend(chains.read_span(segment, first_second, last_second, cursor,
                                               self.passing, self._on_skip))
            self.scan_second = last_second + 1
            return True
        bits = segment.occupied >> (first_second - base_second)
        bits &= (1 << (last_second - first_second + 1)) - 1
        second = first_second
        while bits and len(self.queue) < enough_msgs and self._budget:
            skip = (bits & -bits).bit_length() - 1
            second += skip
            if not self._load_second(segment, second, cursor, enough_msgs):
                self.scan_second = second
                return False
            bits >>= skip + 1
            second += 1
            self.scan_second = second
        if not bits:
            self.scan_second = last_second + 1
        return True

    def _load_second(self, segment: HourSegment, slot: int, cursor: Cursor,
                     enough_msgs: int) -> bool:
        """Read ``slot``'s chain (newest first) onto the queue: whole, in dispatch order,
        when it holds no more units than a take may read (False, and nothing read, when what
        is left of this take's budget is short of it and the queue holds something to take
        meanwhile); otherwise as a walk: a share now, the rest as the dispatch takes it."""
        second_of_hour = slot % SECONDS_PER_HOUR
        walk = Walk(slot, ALL_TAGS, segment.heads[second_of_hour << 1])
        count = segment.heads[(second_of_hour << 1) + 1]
        if count <= self._config.max_load_units:
            if count > self._budget and self.queue:
                return False
            left, _ = self._read_chain(segment, walk, cursor, count, count)
            self._budget = max(0, self._budget - (count - left))
            return True
        room = min(enough_msgs, self._config.max_window_msgs - len(self.queue))
        self._budget, _ = self._read_chain(segment, walk, cursor, self._budget, room)
        if not walk.done:
            self._walks.append(walk)
            self._walks.sort(key=chains.walk_order)
        return True

    def _read_chain(self, segment: HourSegment, walk: Walk, cursor: Cursor, budget: int,
                    room: int) -> tuple[int, int]:
        """`Walk.read` onto the queue, from the cursor on."""
        done_below = cursor.local_index if walk.second == cursor.second else 0
        return walk.read(segment, self.passing, self.queue.push, self._on_skip, done_below,
                         budget, room, self._now_ms)
