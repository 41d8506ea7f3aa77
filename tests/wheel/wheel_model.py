"""A plain reference model of the wheel: a list of entries, sorted when asked.

It restates the rules of `tickwheel.wheel` in the most obvious way - no files, no chains, no
window - so that the stateful test can compare the engine against it step by step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tickwheel.wheel import CancelResult

SECONDS_PER_HOUR = 3600


@dataclass
class Entry:
    handle: int
    id: str
    body: bytes
    properties: dict[str, str]
    deliver_at_ms: int
    slot: int
    local: int
    cancelled: bool = False
    taken: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return (self.slot, self.local)

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.slot, self.deliver_at_ms, self.local)

    @property
    def due_ms(self) -> int:
        return max(self.deliver_at_ms, self.slot * 1000)


class Model:
    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        self.cursor = (0, 0)
        self.stamp_ms = 0

    def counts(self) -> Counter[int]:
        return Counter(entry.slot for entry in self.entries.values())

    def slot_for(self, deliver_at_ms: int, stamp_ms: int, counts: Counter[int]) -> int:
        slot = max(deliver_at_ms // 1000, stamp_ms // 1000, self.cursor[0])
        if slot == self.cursor[0] and counts[slot] < self.cursor[1]:
            slot += 1
        return slot

    def schedule(self, messages: list, now_ms: int, handles: list[int]) -> None:
        self.stamp_ms = max(now_ms, self.stamp_ms)
        counts = self.counts()
        for message, handle in zip(messages, handles, strict=True):
            slot = self.slot_for(message.deliver_at_ms, self.stamp_ms, counts)
            assert handle >> 32 == slot // SECONDS_PER_HOUR, (handle, slot)
            assert handle not in self.entries
            self.entries[handle] = Entry(handle, message.id, message.body,
                                         dict(message.properties), message.deliver_at_ms, slot,
                                         counts[slot])
            counts[slot] += 1

    def pending(self) -> list[Entry]:
        return [e for e in self.entries.values() if not e.cancelled and e.key >= self.cursor]

    def take(self, now_ms: int, max_msgs: int) -> list[Entry]:
        due = sorted((e for e in self.pending() if not e.taken and e.due_ms <= now_ms),
                     key=lambda e: e.order)[:max_msgs]
        for entry in due:
            entry.taken = True
        return due

    def next_due_ms(self) -> int | None:
        times = [e.due_ms for e in self.pending() if not e.taken]
        return min(times) if times else None

    def cancel(self, handle: int) -> CancelResult:
        entry = self.entries[handle]
        if (entry.slot // 3600 + 1) * 3600 <= self.cursor[0]:
            return CancelResult.NOT_PENDING  # the hour is deleted with whatever it knew
        if entry.cancelled:
            return CancelResult.ALREADY_CANCELLED
        if entry.key < self.cursor:
            return CancelResult.NOT_PENDING
        entry.cancelled = True
        return CancelResult.CANCELLED

    def cursor_limit(self) -> tuple[int, int] | None:
        """The furthest cursor allowed: the first pending message not yet taken."""
        keys = [e.key for e in self.pending() if not e.taken]
        return min(keys) if keys else None

    def rewind(self) -> None:
        for entry in self.entries.values():
            entry.taken = False

    def lose(self, hour: int, survivors: int, lost_tombstones: set[int]) -> None:
        """Apply a torn file: units ``>= survivors`` of ``hour`` are gone, and so are the
        tombstones of ``lost_tombstones`` (global indexes)."""
        for handle in list(self.entries):
            if handle >> 32 != hour:
                continue
            global_index = handle & 0xFFFF_FFFF
            if global_index >= survivors:
                del self.entries[handle]
            elif global_index in lost_tombstones:
                self.entries[handle].cancelled = False
