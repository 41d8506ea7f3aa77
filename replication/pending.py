"""Pending messages per topic: scheduled, and neither cancelled nor passed by the cursor.

Replicated state, changed only while applying commands, so every replica holds the same counts:

- a schedule adds one per message it files (not a retried id, not a refused message);
- a cancel that tombstones a message takes one off;
- a cursor command takes off the messages it passes that were not cancelled.

The wheel is keyed by due time, not topic, so each message carries its topic's *tag* (a number)
in its index unit; `Wheel.live_tags_until` counts the tags a cursor move passes. Tags are
handed out here, lowest free first, and come free when their topic's count falls to zero.

Bounded: topics are chosen by users, so at most ``max_tracked_topics`` are tracked at once.
Messages of a further topic get tag 0 and are counted together as *untracked* (the total stays
right); once a tag is free again, the topic's later messages are tracked under their own name.
The counts are part of every snapshot (`snapshot` / `restore`), so a restart and a snapshot
install find them again.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Final

from tickwheel.common.errors import InvariantViolation, invariant

UNTRACKED_TAG: Final = 0
MAX_TAG: Final = 0xFFFF
"""A tag is 16 bits in the wheel's index unit."""

Snapshot = tuple[int, dict[str, tuple[int, int]]]
"""``(untracked, {topic: (tag, count)})``: plain values, for the snapshot file."""


class PendingCounts:
    """Per-topic pending counts and the topic <-> tag table. Single-threaded (the Raft
    thread); other threads read `by_topic` and `untracked`."""

    def __init__(self, max_tracked_topics: int) -> None:
        invariant(0 < max_tracked_topics <= MAX_TAG,
                  f"max_tracked_topics={max_tracked_topics} must be in 1..{MAX_TAG}")
        self._max_tracked_topics = max_tracked_topics
        self._tags: dict[str, int] = {}
        self._topics: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self._free: list[int] = []
        self.untracked = 0
        self.restore((0, {}))

    def by_topic(self) -> dict[str, int]:
        """A copy of the tracked counts (``dict.copy`` is atomic, so any thread may call it)."""
        return self._counts.copy()

    def tag_of(self, topic: str) -> int | None:
        """``topic``'s own tag, if it has one (not `UNTRACKED_TAG`); assigns none."""
        return self._tags.get(topic)

    def tag_for(self, topic: str) -> int:
        """The tag of ``topic``'s messages from now on: its own, a newly assigned one, or
        `UNTRACKED_TAG` when ``max_tracked_topics`` are tracked already."""
        tag = self._tags.get(topic)
        if tag is not None:
            return tag
        if not self._free:
            return UNTRACKED_TAG
        tag = heapq.heappop(self._free)
        self._tags[topic], self._topics[tag] = tag, topic
        self._counts[topic] = 0
        return tag

    def add(self, tags: list[int]) -> None:
        """Messages with these tags were filed."""
        for tag, count in Counter(tags).items():  # counted in C: a batch has few topics
            if tag == UNTRACKED_TAG:
                self.untracked += count
            else:
                self._counts[self._topics[tag]] += count

    def remove(self, counts: dict[int, int]) -> None:
        """``counts[tag]`` messages of each tag are no longer pending (cancelled, or passed by
        the cursor). A topic whose count reaches zero gives its tag back."""
        for tag, removed in counts.items():
            if tag == UNTRACKED_TAG:
                self.untracked -= removed
                invariant(self.untracked >= 0, f"untracked pending fell to {self.untracked}")
                continue
            topic = self._topics.get(tag)
            if topic is None:
                raise InvariantViolation(f"pending count of unknown tag {tag}")
            left = self._counts[topic] - removed
            invariant(left >= 0, f"pending count of topic {topic!r} fell to {left}")
            if left:
                self._counts[topic] = left
            else:
                self._forget(topic, tag)

    def snapshot(self) -> Snapshot:
        return self.untracked, {topic: (self._tags[topic], count)
                                for topic, count in self._counts.items()}

    def restore(self, snapshot: Snapshot) -> None:
        """Take the counts of a snapshot (replacing these)."""
        untracked, topics = snapshot
        self._tags, self._topics, self._counts = {}, {}, {}
        self.untracked = untracked
        for topic, (tag, count) in topics.items():
            invariant(0 < tag <= MAX_TAG, f"snapshot tag {tag} out of range")
            self._tags[topic], self._topics[tag], self._counts[topic] = tag, topic, count
        self._free = [tag for tag in range(1, self._max_tracked_topics + 1)
                      if tag not in self._topics]

    def _forget(self, topic: str, tag: int) -> None:
        del self._tags[topic], self._topics[tag], self._counts[topic]
        heapq.heappush(self._free, tag)
