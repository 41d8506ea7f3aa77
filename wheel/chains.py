"""What the preload window (`tickwheel.wheel.window`) holds and reads: its entries, the walks
down a second's chain it reads a share at a time, and the stretches of a chain where a parked
tag's units were passed over (and how a unit passed over extends them). Plain data; the
window owns every instance.
"""

from __future__ import annotations

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


def walk_order(walk: Walk) -> tuple[int, bool]:
    """Oldest second first; in a second, what was passed over before the rest of its chain."""
    return walk.second, walk.tag == ALL_TAGS


Stretch = list[int]
"""``[first unit, end unit]`` of a chain where a parked tag's units were passed over: the end
is `OPEN` while the walk passing over them goes on (it ends where that walk is when the tag
is taken again)."""
OPEN = -2


def pass_over(passed: dict[tuple[int, int], list[Stretch]], tag: int, second: int,
              unit: int) -> None:
    """A unit of parked ``tag`` in ``second``'s chain is passed over by the walk reading
    it: it begins a stretch, unless that walk passed over the tag's units before it
    (the chain runs newest first, the walk down it)."""
    stretches = passed.setdefault((tag, second), [])
    if not stretches or stretches[-1][1] != OPEN:
        stretches.append([unit, OPEN])


def pass_over_all(passed: dict[tuple[int, int], list[Stretch]], tag: int, second: int,
                  unit: int) -> None:
    """A unit of parked ``tag`` in ``second`` is passed over by one scan of its hour,
    which reads every unit of the second (in index order, oldest first): the stretch
    runs from the newest of them to the chain's end."""
    stretches = passed.setdefault((tag, second), [])
    if stretches:
        stretches[-1][0] = max(stretches[-1][0], unit)
    else:
        stretches.append([unit, -1])


def rewalk(walks: list[Walk], passed: dict[tuple[int, int], list[Stretch]],
           parked: frozenset[int], resumed: frozenset[int]) -> list[Walk]:
    """The walks to read on once ``parked`` are the parked tags: a walk of a tag parked
    again becomes a stretch passed over (it goes on from there when the tag is resumed),
    and the stretches of the ``resumed`` tags become walks, oldest second first."""
    kept = [walk for walk in walks if walk.tag not in parked]
    for walk in walks:
        if walk.tag in parked:
            passed.setdefault((walk.tag, walk.second), []).append([walk.next_unit,
                                                                   walk.end_unit])
    reading = {walk.second: walk.next_unit for walk in kept if walk.tag == ALL_TAGS}
    for (tag, second), stretches in list(passed.items()):
        if tag in resumed:
            del passed[tag, second]
            for first, end in stretches:
                # an open stretch ends where the second's walk is: it reads on from there
                kept.append(Walk(second, tag, first,
                                 reading.get(second, -1) if end == OPEN else end))
    kept.sort(key=walk_order)
    return [walk for walk in kept if not walk.done]
