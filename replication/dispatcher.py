"""What the leader takes from the wheel when it comes due, and how far the cursor may move.

Pure: the Raft thread calls it with the wheel and the time; it never reads a clock or talks to
the network.

A due message leaves the wheel by a replicated *handout* (`tickwheel.replication.groups`): from
then on it waits in its consumer groups, and the wheel is done with it. So the cursor no longer
waits for consumers: it moves over positions that are *readied* (the state machine records them,
the same on every replica) or *skipped* (cancelled or corrupt: the wheel reports those through
`Wheel.drain_skipped`). It leaves a second only when all the second's messages are resolved and
the second is *closed*: it is before the stamp's second, so no message can be filed into it any
more (the wheel files late arrivals at the later of their due, stamp and cursor seconds).
Without that rule a schedule in flight in the Raft log when the cursor is proposed could land
behind the cursor and be lost at the next hand-over.

A new leader starts from the replicated cursor and the replicated readied positions: it takes
again exactly what no handout readied. Nothing here needs a clock to be right: which deliveries
may repeat is a matter of leases (`tickwheel.replication.groups`), not of time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from pyroaring import BitMap

from tickwheel.replication.commands import LeaseRef
from tickwheel.wheel import Cursor, DueMessage, Wheel
from tickwheel.wheel.format import MS_PER_SECOND


class Delivery(NamedTuple):
    """A message whose lease was granted, for the sink to send. ``epoch`` identifies the
    leadership that granted it; ``consumer`` is the sink's key of the consumer it is for."""

    message: DueMessage
    consumer: int
    lease: LeaseRef
    possible_duplicate: bool
    """An earlier lease of this message in this group exists: a consumer may have it."""
    epoch: int


class Expired(NamedTuple):
    """A lease whose deadline passed: the sink retries the message (`Replica.retry`)."""

    message: DueMessage
    lease: LeaseRef
    group: str
    epoch: int
    consumer: int | None
    """The sink's key of the consumer holding it, if this leadership granted it."""
    durable: bool = False
    """A `DURABLE` lease: its deadline was the consumer's own choice of when to see the
    message again (an invisible duration), not a failure detector's."""


class DeliverySink(Protocol):
    """Where granted messages go. Called on the Raft thread: it must not block. The sink
    acks, nacks and releases by `LeaseRef` through the `Replica` (from any thread)."""

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor,
                         takeover_ms: int) -> None:
        """This node now dispatches, from ``cursor``; deliveries of ``epoch`` follow."""

    def deliver(self, deliveries: list[Delivery]) -> None:
        """Send these to their consumers (a consumer gone by now: release the lease), each
        at its due time: a delivery may arrive up to ``DispatchConfig.slow_lead_ms`` before it.
        Report each send (`Replica.sent`): the lease's visibility timeout counts from it."""

    def expired(self, leases: list[Expired]) -> None:
        """These leases ran out: retry their messages."""

    def dispatch_stopped(self, epoch: int) -> None:
        """This node no longer dispatches: drop everything of ``epoch`` not yet sent (its
        leases stay in the log; the next leader honours or releases them)."""


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    max_inflight_msgs: int = 10_000
    """Leased and not yet acknowledged, per consumer group; its grants wait when this many
    are out."""
    max_inflight_bytes: int = 256 << 20
    """Bodies leased and not yet acknowledged, per consumer group (one grant may overshoot
    it by ``max_take_msgs`` bodies)."""
    max_take_msgs: int = 500
    """Messages taken from the wheel per dispatch step: what one step costs the Raft thread
    (a step of 1,000 took it 30-45 ms) and what a message due meanwhile waits behind."""
    max_unapplied_msgs: int = 1_000
    """Messages taken and proposed in handouts not yet applied; taking waits past it. Two
    steps of a backlog in the log at once: a schedule, a grant or another topic's handout
    waits behind those alone (20,000 made them wait 200-300 ms behind a burst), and the
    burst drained no slower."""
    lead_ms: int = 20
    """Messages are readied and leased up to this long before they are due, so the handout's
    commit round runs while they wait; the sink sends each at its due time, not before."""
    min_lead_ms: int = 10
    """A dispatch step comes when the first message not yet taken is due within this long,
    and takes everything due within ``lead_ms``: at a steady rate a step every ``lead_ms -
    min_lead_ms`` (one handout, one Raft round, one hand-over to the sink), each message
    readied at least ``min_lead_ms`` ahead. A message due sooner (scheduled late, a backlog)
    is taken at the next turn."""
    slow_lead_ms: int = 30
    """A step that takes fewer than ``slow_step_msgs`` also takes what comes due within this
    long (up to that many): a step costs about the same whatever it carries, so at a slow
    rate one every ``slow_lead_ms - min_lead_ms`` (20 ms) makes half the Raft rounds; at a
    rate that fills steps they come every ``lead_ms - min_lead_ms``."""
    topic_share_msgs: int = 250
    """A step takes at most this many of one topic's due messages before every other
    topic's due messages (then that topic fills the room they leave): a backlog due before
    everything else, a burst, still leaves each step room for the others."""
    slow_step_msgs: int = 64
    """How many messages a step carries at most for it to take ahead to ``slow_lead_ms``."""
    max_ready_ahead_msgs: int = 20_000
    """A topic's messages wait in the wheel while one of its groups that consumers read holds
    this many ready (readied and not leased, or on their way to it), and are readied again
    once it is down to half: a burst is readied as fast as it is consumed, its groups never
    reach ``max_ready_msgs``, and the other topics go on meanwhile. A step takes at most this
    many."""

    @classmethod
    def ready_ahead_for(cls, max_ready_msgs: int) -> int:
        """``max_ready_ahead_msgs`` for groups that keep ``max_ready_msgs``: at most half, so
        that a step taken just below it, and the leases of a consumer that leaves, still fit."""
        return max(1, min(cls().max_ready_ahead_msgs, max_ready_msgs // 2))


class Dispatcher:
    """Leader-side wheel state for one leadership (an *epoch*)."""

    def __init__(self, config: DispatchConfig) -> None:
        self._config = config
        self._epoch = 0
        self._active = False
        self._taken: dict[int, BitMap] = {}
        """Positions taken by this leadership (readied or on their way to it)."""
        self._skipped: dict[int, set[int]] = {}
        self.unapplied_by_topic: dict[str, int] = {}
        """Messages taken whose handout is not applied yet, per topic."""

    @property
    def unapplied(self) -> int:
        """Messages taken whose handout is not applied yet."""
        return sum(self.unapplied_by_topic.values())

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def active(self) -> bool:
        return self._active

    def begin(self, wheel: Wheel, readied: dict[int, BitMap]) -> None:
        """Start a leadership: take again from the replicated cursor everything that no
        handout readied."""
        self._epoch += 1
        self._active = True
        self._taken = {second: indexes.copy() for second, indexes in readied.items()}
        self._skipped.clear()
        self.unapplied_by_topic.clear()
        wheel.park(frozenset())
        wheel.rewind()

    def end(self) -> None:
        """The leadership is over: what it took and did not ready, the next leader takes."""
        self._epoch += 1
        self._active = False
        self._taken.clear()
        self._skipped.clear()
        self.unapplied_by_topic.clear()

    def take(self, wheel: Wheel, now_ms: int, max_msgs: int | None = None
             ) -> list[DueMessage]:
        """Take what is due and not readied yet (at most ``max_take_msgs``, or ``max_msgs``
        if fewer)."""
        limit = self._config.max_take_msgs
        room = min(limit if max_msgs is None else min(limit, max_msgs),
                   self._config.max_ready_ahead_msgs,
                   self._config.max_unapplied_msgs - self.unapplied)
        if not self._active or room <= 0:
            return []
        taken_positions = self._taken
        taken: list[DueMessage] = []
        # a step behind a backlog has the room its handouts just applied made: a share of it
        share = max(1, min(self._config.topic_share_msgs, room // 4))
        # a walk of passed-over messages may read one again: each goes once a leadership
        for message in wheel.take_due(now_ms, room, share):
            positions = taken_positions.get(message.slot_second)
            if positions is None:
                positions = taken_positions[message.slot_second] = BitMap()
            if message.local_index not in positions:
                positions.add(message.local_index)
                taken.append(message)
        for second, local_index in wheel.drain_skipped():
            self._skipped.setdefault(second, set()).add(local_index)
        by_topic = self.unapplied_by_topic
        for message in taken:
            by_topic[message.topic] = by_topic.get(message.topic, 0) + 1
        return taken

    def applied(self, topics: list[str]) -> None:
        """The handout of messages of these topics (one each) is applied, or failed."""
        by_topic = self.unapplied_by_topic
        for topic in topics:
            left = by_topic.get(topic, 0) - 1
            if left > 0:
                by_topic[topic] = left
            else:
                by_topic.pop(topic, None)

    def next_cursor(self, wheel: Wheel, readied: dict[int, BitMap], now_ms: int
                    ) -> tuple[Cursor, bool]:
        """How far the cursor may move over ``readied`` (applied) and skipped positions, and
        whether only a newer stamp holds it back (then a cursor command, which carries one,
        is worth proposing even if the cursor is the same)."""
        second, local_index = wheel.cursor
        for table in (self._skipped, self._taken):
            for passed in [s for s in table if s < second]:
                del table[passed]
        closed_second = wheel.stamp_ms // MS_PER_SECOND
        while True:
            done = readied.get(second, ())
            skipped = self._skipped.get(second, ())
            while local_index in done or local_index in skipped:
                local_index += 1
            if local_index < wheel.count_at(second):
                break
            if second >= closed_second:
                following = wheel.next_occupied_second(second + 1)
                waiting = following is not None and following * MS_PER_SECOND <= now_ms
                return Cursor(second, local_index), waiting
            following = wheel.next_occupied_second(second + 1)
            second = closed_second if following is None else min(following, closed_second)
            local_index = 0
        return Cursor(second, local_index), False
