"""One consumer group: its ready messages and its leases (`tickwheel.replication.groups` has the
design, and `Groups` the registry), and the record of messages readied into several groups.

Single-threaded (the Raft thread), like `Groups`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

STREAM: Final = 0
"""A lease that ends when the consumer's stream closes (and when its leader loses office)."""
DURABLE: Final = 1
"""A lease that ends only at its deadline, an ack, a nack or a change of its deadline."""
DEFAULT_GROUP: Final = ""
"""The group of consumers that name none, and of a topic's messages before any group exists."""

PlainGroup = tuple[int, str, str, int, int, list[tuple[int, tuple[int, int]]],
                   list[tuple[int, int, int, int, int]]]
"""A group as plain values, for the snapshot file: ``(id, topic, name, created_ms, dropped,
ready items, [(handle, *lease)])``."""


class Lease(NamedTuple):
    seq: int
    nonce: int
    deadline_ms: int
    mode: int


class GroupSummary(NamedTuple):
    topic: str
    name: str
    ready: int
    leased: int
    dropped: int


@dataclass(eq=False, slots=True)
class Group:
    id: int
    topic: str
    name: str
    created_ms: int
    ready: OrderedDict[int, tuple[int, int]] = field(default_factory=OrderedDict)
    """handle -> (seq, nonce) of its last lease, or (0, 0); oldest first."""
    leases: dict[int, Lease] = field(default_factory=dict)
    dropped: int = 0
    """Ready messages dropped past ``max_ready_msgs`` (replicated: the same on every node)."""

    def current(self, handle: int, seq: int, nonce: int) -> Lease | None:
        """The lease of ``handle`` if ``(seq, nonce)`` names its current one."""
        lease = self.leases.get(handle)
        return lease if lease is not None and (lease.seq, lease.nonce) == (seq, nonce) else None

    def back_to_ready(self, handle: int, lease: Lease) -> None:
        """End a lease early: the message is ready again, first in line, under ``lease``'s
        number and nonce (what the next grant counts from, and what an ack of the old receipt
        matches)."""
        del self.leases[handle]
        self.ready[handle] = (lease.seq, lease.nonce)
        self.ready.move_to_end(handle, last=False)

    def release_streams(self) -> int:
        """Every stream lease ends: its message is ready again. Returns how many."""
        streamed = [(h, lease) for h, lease in self.leases.items() if lease.mode == STREAM]
        for handle, lease in reversed(streamed):
            self.back_to_ready(handle, lease)
        return len(streamed)

    def plain(self) -> PlainGroup:
        return (self.id, self.topic, self.name, self.created_ms, self.dropped,
                list(self.ready.items()), [(h, *lease) for h, lease in self.leases.items()])

    @classmethod
    def from_plain(cls, plain: PlainGroup) -> Group:
        group_id, topic, name, created_ms, dropped, ready, leases = plain
        return cls(group_id, topic, name, created_ms,
                   OrderedDict((h, (seq, nonce)) for h, (seq, nonce) in ready),
                   {h: Lease(seq, nonce, deadline_ms, mode)
                    for h, seq, nonce, deadline_ms, mode in leases}, dropped)


class FanOut:
    """The messages readied into more than one group: how many groups still hold each, and
    whether any of them leased it, so that a cancel knows whether any group handed it out
    even after that group resolved it. A message readied into one group needs no entry: its
    group's own state tells."""

    def __init__(self, state: dict[int, list[Any]] | None = None) -> None:
        self._state = state or {}
        """handle -> [groups still holding it, whether any leased it]"""

    def __bool__(self) -> bool:
        """Whether any message is readied into several groups (callers skip the rest)."""
        return bool(self._state)

    def readied(self, handle: int, groups: int) -> None:
        if groups > 1:
            self._state[handle] = [groups, False]

    def leased(self, handle: int) -> None:
        entry = self._state.get(handle)
        if entry is not None:
            entry[1] = True

    def ever_leased(self, handle: int) -> bool:
        entry = self._state.get(handle)
        return entry is not None and bool(entry[1])

    def resolved(self, handle: int) -> None:
        """One group let go of ``handle`` (acked, retried, cancelled, dropped or deleted)."""
        entry = self._state.get(handle)
        if entry is not None:
            entry[0] -= 1
            # with one holder left, its own state tells a cancel enough unless another group
            # leased the message: then the entry stays until the last holder resolves it
            if entry[0] <= 0 or (entry[0] == 1 and not entry[1]):
                del self._state[handle]

    def snapshot(self) -> dict[int, list[Any]]:
        return {handle: list(entry) for handle, entry in self._state.items()}
