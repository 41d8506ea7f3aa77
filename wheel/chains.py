"""What the preload window (`tickwheel.wheel.window`) holds and reads: its entries, the walks
down a second's chain it reads a share at a time (`Walk.read`), a span of seconds read with
one index scan (`read_span`), and what they pass over (`Passing`): the stretches of a chain
where a parked tag's units, or a following tag's, were passed over, and how a unit passed
over extends them. Plain data and the reading of an hour segment; the window owns every
instance and calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import count
from typing import TYPE_CHECKING

from tickwheel.wheel.format import SECONDS_PER_HOUR

if TYPE_CHECKING:
    from tickwheel.wheel.segment import HourSegment
    from tickwheel.wheel.types import Cursor

GLOBAL_INDEX_BITS = 32
GLOBAL_INDEX_MASK = (1 << GLOBAL_INDEX_BITS) - 1
"""A handle is ``hour << GLOBAL_INDEX_BITS | global_index``."""

WindowEntry = tuple[int, int, int, int, int, int, int]
"""``(slot_second, deliver_at_ms, local_index, handle, log_offset, record_size, tag)``. Their
order is dispatch order; the handle makes every entry unique."""


ALL_TAGS = -1
"""A walk of every unit of its second (the rest of a long chain), not of one tag's."""


class Walk:
    """``second``'s chain from ``next_unit`` down to ``end_unit`` (exclusive; -1: to the
    chain's end), to read for the units of ``tag`` (`ALL_TAGS`: of every tag not parked). A
    walk is done when ``next_unit`` reaches ``end_unit``. ``due_ms``: when none of the units
    its last read put onto the queue was due, the earliest of their due times (else 0); it
    is read on once that has come, so a second not due yet is not read into memory take
    after take."""

    __slots__ = ("due_ms", "end_unit", "next_unit", "second", "tag")

    def __init__(self, second: int, tag: int, next_unit: int, end_unit: int = -1) -> None:
        self.second = second
        self.tag = tag
        self.next_unit = next_unit
        self.end_unit = end_unit
        self.due_ms = 0

    @property
    def done(self) -> bool:
        return self.next_unit <= self.end_unit

    def read(self, segment: HourSegment, passing: Passing,
             push: Callable[[WindowEntry], None], on_skip: Callable[[int, int], None],
             done_below: int, budget: int, room: int, now_ms: int) -> tuple[int, int]:
        """Read the chain on, at most ``budget`` units, until ``room`` are pushed: its units
        (of its tag) from local index ``done_below`` on, but those ``passing`` skips (passed
        over) and cancelled ones (skipped). Returns the budget left and how many it pushed."""
        slot, only = self.second, self.tag
        tombstones, skips = segment.tombstones, passing.skips(only)
        base = segment.hour << GLOBAL_INDEX_BITS
        unit, end = self.next_unit, self.end_unit
        pushed = 0
        due_ms = 1 << 62
        while unit > end and budget and pushed < room:
            offset, size, local_index, global_index, older, deliver_at_ms, _, tag = (
                segment.read_unit(unit))
            budget -= 1
            if local_index < done_below:
                older = end
            elif only not in (ALL_TAGS, tag):
                pass
            elif global_index in tombstones:
                on_skip(slot, local_index)
            elif tag in skips:
                passing.pass_over(tag, slot, global_index)
            else:
                push((slot, deliver_at_ms, local_index, base | global_index, offset, size, tag))
                pushed += 1
                due_ms = min(due_ms, deliver_at_ms)
            unit = older
        self.due_ms = due_ms if pushed and due_ms > now_ms else 0
        self.next_unit = unit
        return budget, pushed


def walk_order(walk: Walk) -> tuple[int, bool]:
    """Oldest second first; in a second, the walk of every tag before the walks of one tag
    (which read what it passed over)."""
    return walk.second, walk.tag != ALL_TAGS


Stretch = list[int]
"""``[first unit, end unit]`` of a chain where a tag's units were passed over: the end is
`OPEN` while the walk passing over them goes on (it ends where that walk is when they are
read)."""
OPEN = -2
Stretches = dict[tuple[int, int], list[Stretch]]
"""(tag, second) -> the stretches of the second's chain passed over for the tag."""


class Passing:
    """The tags whose units the window's walks pass over, and where they did:

    - *parked* tags (`DueWindow.park`): passed over by every walk; their stretches wait
      (`parked_stretches`) until the tag is taken again, and a walk of a tag parked again
      becomes a stretch;
    - *following* tags (`follow`): tags with a backlog or with walks of their own, passed
      over by the walks of every tag (so that what the chain holds of the other tags beyond
      a burst is read without reading the burst first); their stretches become walks of
      their own at the next take, which read them as fast as the tag is taken.
    """

    def __init__(self) -> None:
        self.parked: frozenset[int] = frozenset()
        self.following: frozenset[int] = frozenset()
        self.parked_stretches: Stretches = {}
        self._trailing: Stretches = {}

    def seconds(self) -> list[int]:
        """The seconds where units were passed over and not read since."""
        return [second for _, second in (*self.parked_stretches, *self._trailing)]

    def first_trailing(self) -> int | None:
        """The first second where a following tag's units were passed over: walks of the
        tag read them from the next take on."""
        return min((second for _, second in self._trailing), default=None)

    def forget_from(self, second: int) -> None:
        """Forget where units of ``second`` and later were passed over: they are read again."""
        for passed in (self.parked_stretches, self._trailing):
            for key in [key for key in passed if key[1] >= second]:
                del passed[key]

    def clear(self) -> None:
        self.parked_stretches.clear()
        self._trailing.clear()
        self.following = frozenset()

    def skips(self, walk_tag: int) -> frozenset[int]:
        """The tags a walk of ``walk_tag`` passes over."""
        return self.parked | self.following if walk_tag == ALL_TAGS else self.parked

    def pass_over(self, tag: int, second: int, unit: int) -> None:
        """A unit of ``tag`` in ``second``'s chain is passed over by the walk reading it: it
        begins a stretch, unless that walk passed over the tag's units before it (the chain
        runs newest first, the walk down it)."""
        passed = self.parked_stretches if tag in self.parked else self._trailing
        stretches = passed.setdefault((tag, second), [])
        if not stretches or stretches[-1][1] != OPEN:
            stretches.append([unit, OPEN])

    def pass_over_all(self, tag: int, second: int, unit: int) -> None:
        """A unit of parked ``tag`` in ``second`` is passed over by one scan of its hour,
        which reads every unit of the second (in index order, oldest first): the stretch
        runs from the newest of them to the chain's end."""
        stretches = self.parked_stretches.setdefault((tag, second), [])
        if stretches:
            stretches[-1][0] = max(stretches[-1][0], unit)
        else:
            stretches.append([unit, -1])

    def pass_over_filed(self, tag: int, second: int, first: int, end: int, below: int) -> None:
        """Units of parked ``tag`` just filed into ``second``, a second the window has read,
        are passed over: the chain from ``first`` down to ``end`` (exclusive; ``below`` is the
        unit filed there before them). It extends the stretch of an earlier filing that
        begins at ``below``; else it is a stretch of its own, put first, so that a walk's open
        stretch (the last) goes on."""
        stretches = self.parked_stretches.setdefault((tag, second), [])
        if stretches and stretches[0][1] != OPEN and stretches[0][0] == below:
            stretches[0][0] = first
        else:
            stretches.insert(0, [first, end])

    def follow(self, walks: list[Walk], backlogs: frozenset[int]) -> list[Walk]:
        """A take begins: the stretches passed over of following tags become walks of their
        tag (a stretch still open ends where the walk of its second is now: what it passes
        over from there on begins another), and the following tags are ``backlogs`` and the
        tags with walks of their own."""
        if self._trailing:
            _extend(walks, self._trailing, self._trailing.keys())
            walks = sorted(walks, key=walk_order)
        walks = [walk for walk in walks if not walk.done]
        self.following = backlogs.union(walk.tag for walk in walks) - {ALL_TAGS}
        return walks

    def park(self, walks: list[Walk], tags: frozenset[int]) -> list[Walk]:
        """The walks to read on once ``tags`` are the parked tags: a walk of a tag parked
        again becomes a stretch passed over (it goes on from there when the tag is taken
        again), and the stretches of the tags taken again become walks."""
        resumed = self.parked - tags
        self.parked = tags
        passed = self.parked_stretches
        for key in [key for key in self._trailing if key[0] in tags]:
            passed.setdefault(key, []).extend(self._trailing.pop(key))
        kept = [walk for walk in walks if walk.tag not in tags]
        for walk in walks:
            if walk.tag in tags:
                passed.setdefault((walk.tag, walk.second), []).append([walk.next_unit,
                                                                       walk.end_unit])
        _extend(kept, passed, [key for key in passed if key[0] in resumed])
        kept.sort(key=walk_order)
        return [walk for walk in kept if not walk.done]


def leave_filed(segment: HourSegment, passing: Passing, walks: list[Walk], first_unit: int,
                slots: list[int], tags: Sequence[int], scan_second: int,
                long_units: int | None) -> set[int]:
    """Leave in ``segment`` units just filed there (``first_unit`` on, one per slot) into
    seconds the window has read (before ``scan_second``): those of parked tags and, with
    ``long_units``, every unit of a second that now holds more than that (a long second, whose
    messages go in the order read, as the walk of its older units does). Per second and tag,
    the chain from the tag's newest of them down to what was filed before them is passed over
    (a parked tag's) or a walk of the tag, which extends a walk of the tag that was to read on
    from there. Returns the seconds left whole."""
    hour_second = segment.hour * SECONDS_PER_HOUR
    heads = segment.heads
    long = {slot for slot in set(slots) if slot < scan_second and long_units is not None
            and heads[((slot - hour_second) << 1) + 1] > long_units}
    newest: dict[tuple[int, int], int] = {}
    oldest: dict[int, int] = {}
    parked = passing.parked
    for unit, slot, tag in zip(count(first_unit), slots, tags, strict=False):
        if slot < scan_second and (slot in long or tag in parked):
            newest[slot, tag] = unit
            oldest.setdefault(slot, unit)
    for (slot, tag), unit in newest.items():
        below = segment.read_unit(oldest[slot])[4]
        if tag in parked:
            passing.pass_over_filed(tag, slot, unit, first_unit - 1, below)
            continue
        walk = next((w for w in walks if w.second == slot and w.tag == tag
                     and w.next_unit == below), None)
        if walk is None:
            walks.append(Walk(slot, tag, unit, first_unit - 1))
        else:
            walk.next_unit, walk.due_ms = unit, 0
    walks.sort(key=walk_order)
    return long


def _extend(walks: list[Walk], passed: Stretches, keys: Iterable[tuple[int, int]]) -> None:
    """Make walks of the stretches of ``passed`` at ``keys`` (and forget them): an open
    stretch ends where the walk of every tag of its second is now (it reads on from there)."""
    reading = {walk.second: walk.next_unit for walk in walks if walk.tag == ALL_TAGS}
    for key in list(keys):
        tag, second = key
        for first, end in passed.pop(key):
            walks.append(Walk(second, tag, first, reading.get(second, -1) if end == OPEN
                              else end))


def read_span(segment: HourSegment, first_second: int, last_second: int, cursor: Cursor,
              passing: Passing, on_skip: Callable[[int, int], None]) -> list[WindowEntry]:
    """Every unit filed under ``first_second..last_second`` from ``cursor`` on, read with one
    index scan of the hour (in index order), but those of parked tags (passed over) and
    cancelled ones (skipped)."""
    base_second = segment.hour * SECONDS_PER_HOUR
    tombstones, parked = segment.tombstones, passing.parked
    base = segment.hour << GLOBAL_INDEX_BITS
    loaded = [
        (slot, deliver_at_ms, local_index, base | global_index, offset, size, tag)
        for offset, size, local_index, global_index, _, deliver_at_ms, second_of_hour, tag
        in segment.scan()
        if first_second <= (slot := base_second + second_of_hour) <= last_second
        and (slot, local_index) >= cursor
    ]
    if not tombstones and not parked:
        return loaded
    kept = []
    for entry in loaded:
        slot, _, local_index, handle, _, _, tag = entry
        if handle & GLOBAL_INDEX_MASK in tombstones:
            on_skip(slot, local_index)
        elif tag in parked:
            passing.pass_over_all(tag, slot, handle & GLOBAL_INDEX_MASK)
        else:
            kept.append(entry)
    return kept
