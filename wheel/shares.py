"""Fair takes: one tag's backlog never keeps the other tags' due messages waiting.

The window's queue is in dispatch order, and a burst of one topic (a tag) due at one time
sorts before everything due after it: taken in that order, a million messages due at 09:00:00
make every other topic's messages wait until the last of them is out. A fair take
(`DueWindow.take` with ``share_msgs``) gives each tag at most ``share_msgs`` of the take
before the other tags' due messages, and then the room they leave:

- a tag that reaches its share in a take is a *backlog*: its entries move, as the take meets
  them in the queue, to a queue of their own (`Shares.heavy`), at most ``max_moved_msgs`` a
  take (what a take may read: moving costs a pop and a push), so each entry moves once, and
  the window's queue is left with the other tags' entries;
- each take, every backlog gives its share first (in turn: the first backlog asked changes
  from take to take), then the window's queue is taken (a backlog's entries met there move
  to it), then the backlogs fill the room left, in turn;
- a backlog whose queue is empty is a tag like any other again.

Within a tag, messages still go in dispatch order (its queue is a `RunHeap` as the window's
is); between tags, a due message may go before one of another tag due earlier. Nothing here
reads a clock or a file: entries are the window's (`WindowEntry`), and what is taken is
decided by the window, which also keeps parked tags' entries aside as before.
"""

from __future__ import annotations

from tickwheel.common.runheap import RunHeap
from tickwheel.wheel.chains import WindowEntry as Entry


class Shares:
    """The backlogs of a window: a queue per tag that had its share."""

    def __init__(self, max_moved_msgs: int) -> None:
        self.heavy: dict[int, RunHeap[Entry]] = {}
        """tag -> its entries moved off the window's queue, in dispatch order."""
        self._max_moved_msgs = max_moved_msgs
        self._moved = 0
        self._turn = 0

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.heavy.values())

    def begin(self) -> None:
        """A take begins: it may move ``max_moved_msgs`` entries, and the backlogs are asked
        from one further on (`in_turn`)."""
        self._moved = 0
        self._turn += 1

    def defer(self, tag: int, entry: Entry) -> bool:
        """Move ``entry`` to its tag's queue; False when this take moved all it may."""
        if self._moved >= self._max_moved_msgs:
            return False
        self._moved += 1
        queue = self.heavy.get(tag)
        if queue is None:
            queue = self.heavy[tag] = RunHeap[Entry]()
        queue.push(entry)
        return True

    def in_turn(self) -> list[RunHeap[Entry]]:
        """The backlogs' queues, in this take's turn: the same order for each of its calls,
        starting one further at each take."""
        queues = list(self.heavy.values())
        first = self._turn % len(queues) if queues else 0
        return queues[first:] + queues[:first]

    def drop_empty(self) -> None:
        """A backlog whose queue is empty is a tag like any other again."""
        for tag in [tag for tag, queue in self.heavy.items() if not queue]:
            del self.heavy[tag]

    def firsts(self) -> list[Entry]:
        """Each backlog's first entry."""
        return [first for queue in self.heavy.values() if (first := queue.first()) is not None]

    def drain(self) -> list[Entry]:
        """Every backlog's entries, which are backlogs no more (a take without shares)."""
        entries = [entry for queue in self.heavy.values()
                   for entry in (queue.pop() for _ in range(len(queue)))]
        self.heavy.clear()
        return entries

    def clear(self) -> None:
        self.heavy.clear()
