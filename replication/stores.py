"""What the replicated state machine changes, in one place: the wheel, the dedupe window, the
pending counts, the consumer groups, the positions readied past the cursor, the handle key and
the moves of rescheduled messages; and the ledger sink they tell what changed.

The parts that apply commands (`StateMachine`, `Scheduling`, `Retiring`) share one `Stores`,
so a snapshot install, which reopens the files and replaces the rest, reaches all of them.
Single-threaded: the Raft thread owns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyroaring import BitMap

from tickwheel.common.errors import InvalidMessage
from tickwheel.replication.dedupe import DedupeWindow
from tickwheel.replication.groups import Groups
from tickwheel.replication.ledger import LedgerSink
from tickwheel.replication.outcomes import Rejected
from tickwheel.replication.pending import PendingCounts
from tickwheel.wheel import Wheel
from tickwheel.wheel.format import record_topics


@dataclass(eq=False, slots=True)
class Stores:
    wheel: Wheel
    dedupe: DedupeWindow
    pending: PendingCounts
    groups: Groups
    max_delay_ms: int
    """The wheel's ``max_delay_ms``: how far past the leader's stamp a message may be due."""
    readied: dict[int, BitMap] = field(default_factory=dict)
    """Positions at or past the cursor that a handout readied: they have left the wheel
    for their groups (a new leader does not take them again). Per second, local
    indexes, as a compressed bitmap (a second of a million messages readied one by one
    takes about 130 KiB, where a set of them took 66 MB); the cursor passes them once their
    second is complete."""
    handle_key: bytes | None = None
    """The key of the handles clients see (`tickwheel.replication.handle_cipher`), set by the
    first barrier."""
    moves: dict[int, int] = field(default_factory=dict)
    """Rescheduled messages: the handle Schedule returned -> the handle of the copy filed
    at the new due time. Clients keep their handle; cancels and reschedules follow this.
    Kept while either handle's hour is ahead of the cursor (`Retiring.forget_moves`)."""
    ledger: LedgerSink | None = None
    """Where the changes each command made are told (`tickwheel.replication.ledger`); None:
    nowhere."""

    def tags(self, records: list[bytes]) -> list[int]:
        """The pending tag of each record's topic. Each tag handed out must be counted before
        any count is removed (a count at zero frees its tag). Topics get their tags in order of
        first appearance, the same on every replica."""
        topics = record_topics(records)
        tag_of = {topic: self.pending.tag_for(topic.decode()) for topic in dict.fromkeys(topics)}
        return list(map(tag_of.__getitem__, topics))

    def is_readied(self, second: int, local_index: int) -> bool:
        """Whether the message at this position has left the wheel for its groups: behind the
        cursor, or readied past it."""
        return ((second, local_index) < self.wheel.cursor
                or local_index in self.readied.get(second, ()))

    def mark_readied(self, second: int, local_index: int) -> bool:
        """Note that the message at this position leaves the wheel for its groups; False (and
        nothing noted) if it had already (`is_readied`)."""
        if self.is_readied(second, local_index):
            return False
        positions = self.readied.get(second)
        if positions is None:
            positions = self.readied[second] = BitMap()
        positions.add(local_index)
        return True

    def too_late(self, deliver_at_ms: int, stamp_ms: int,
                 field: str = "deliver_at_ms") -> Rejected:
        return Rejected(InvalidMessage(field, (
            f"{deliver_at_ms} is more than {self.max_delay_ms} ms after {stamp_ms}")))
