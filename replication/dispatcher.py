"""What the leader delivers, which deliveries may repeat, and how far the cursor may move.

Pure: the Raft thread calls it with the wheel and the time; it never reads a clock or talks to
the network.

**Done tracking.** The wheel hands messages out in dispatch order ``(slot second,
deliver_at_ms, local_index)``, but the cursor is a position ``(second, local_index)``: every
message before it is done. So the dispatcher keeps, per second, the local indexes that are
*resolved*: delivered and acknowledged, or passed over by the wheel (cancelled, corrupt; the
wheel reports those through `Wheel.drain_skipped`). The cursor moves over resolved local
indexes; it leaves a second only when all the second's messages are resolved and the second is
*closed*: it is before the stamp's second, so no message can be filed into it any more (the wheel
files late arrivals at the later of their due, stamp and cursor seconds). Without that rule a
schedule in flight in the Raft log when the cursor is proposed could land behind the cursor and
be lost at the next hand-over.

**Done past the cursor.** One slow or crashed consumer holds the cursor at its message while
consumers acknowledge thousands after it. So the cursor command also carries the resolved
positions past the cursor (`done_runs`, at most ``max_synced_done_runs`` runs of consecutive
local indexes), and a new leader starts with them resolved: it re-sends only what was in flight,
or acknowledged within the last cursor sync, instead of everything after the slowest message.

**Possible duplicates.** A new leader starts from the replicated cursor; the old one may have
delivered messages past it before it lost its lease. It cannot have delivered a message due
after its own clock at the time its lease ran out, which is before the new leader was elected.
So everything due up to ``takeover_ms + clock_skew_allowance_ms`` (the new leader's clock at
takeover, plus the skew between any two clocks we tolerate) is flagged ``possible_duplicate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tickwheel.replication.commands import DoneRun
from tickwheel.wheel import Cursor, DueMessage, Wheel
from tickwheel.wheel.format import MS_PER_SECOND


class Delivery(NamedTuple):
    """A message handed to the sink. ``epoch`` identifies the leadership that sent it; an
    acknowledgement from an earlier epoch is ignored."""

    message: DueMessage
    possible_duplicate: bool
    dispatched_at_ms: int
    epoch: int


class DeliverySink(Protocol):
    """Where due messages go. Called on the Raft thread: it must not block. The sink reports
    each message done with `tickwheel.replication.replica.Replica.ack` (from any thread)."""

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor,
                         takeover_ms: int) -> None:
        """This node now dispatches, from ``cursor``; deliveries of ``epoch`` follow."""

    def deliver(self, deliveries: list[Delivery]) -> None:
        """Hand these out; report each done with ``Replica.ack`` when it is."""

    def dispatch_stopped(self, epoch: int) -> None:
        """This node no longer dispatches: drop everything of ``epoch`` not yet handed out
        (the next leader re-sends it) and stop handing out more."""


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    max_inflight_msgs: int = 10_000
    """Delivered but not yet acknowledged; dispatch waits when this many are out."""
    max_inflight_bytes: int = 256 << 20
    """Bodies delivered but not yet acknowledged; dispatch waits when this much is out (one
    step may overshoot it by ``max_take_msgs`` bodies)."""
    max_take_msgs: int = 1_000
    """Messages taken from the wheel per dispatch step."""
    clock_skew_allowance_ms: int = 2_000
    """The largest clock difference between nodes that hand-over must tolerate."""
    max_synced_done_runs: int = 1_024
    """Runs of done positions past the cursor that a cursor command carries (16 bytes each);
    beyond them, a new leader re-sends (flagged) what was done further on."""


class Dispatcher:
    """Leader-side dispatch state for one leadership (an *epoch*)."""

    def __init__(self, config: DispatchConfig) -> None:
        self._config = config
        self._epoch = 0
        self._active = False
        self._horizon_ms = 0
        self._resolved: dict[int, set[int]] = {}
        self._inflight = 0
        self._inflight_bytes: dict[tuple[int, int], int] = {}
        self._bytes_out = 0

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def active(self) -> bool:
        return self._active

    @property
    def inflight_msgs(self) -> int:
        return self._inflight

    def begin(self, wheel: Wheel, takeover_ms: int, done: Sequence[DoneRun] = ()) -> None:
        """Start a leadership: dispatch again from the replicated cursor, skipping the
        positions ``done`` says are done already."""
        self._epoch += 1
        self._active = True
        self._horizon_ms = takeover_ms + self._config.clock_skew_allowance_ms
        self._resolved.clear()
        for second, first, count in done:
            self._resolved.setdefault(second, set()).update(range(first, first + count))
        self._inflight = 0
        self._inflight_bytes.clear()
        self._bytes_out = 0
        wheel.rewind()

    def end(self) -> None:
        """The leadership is over: forget what is in flight (the next leader re-sends it)."""
        self._epoch += 1
        self._active = False
        self._resolved.clear()
        self._inflight = 0
        self._inflight_bytes.clear()
        self._bytes_out = 0

    def take(self, wheel: Wheel, now_ms: int) -> list[Delivery]:
        """Take what is due, within the in-flight limit."""
        room = min(self._config.max_take_msgs, self._config.max_inflight_msgs - self._inflight)
        if not self._active or room <= 0 or self._bytes_out >= self._config.max_inflight_bytes:
            return []
        resolved = self._resolved
        taken = [message for message in wheel.take_due(now_ms, room)
                 if message.local_index not in resolved.get(message.slot_second, ())]
        self._resolve(wheel.drain_skipped())
        self._inflight += len(taken)
        for message in taken:  # keyed by plain tuples: equal to the Cursor that done() gets
            self._inflight_bytes[message.slot_second, message.local_index] = len(message.body)
            self._bytes_out += len(message.body)
        horizon_ms = self._horizon_ms
        return [Delivery(message, max(message.deliver_at_ms,
                                      message.slot_second * MS_PER_SECOND) <= horizon_ms,
                         now_ms, self._epoch) for message in taken]

    def done(self, epoch: int, position: Cursor) -> None:
        """The message at ``position`` is acknowledged."""
        if epoch != self._epoch or not self._active:
            return
        resolved = self._resolved.setdefault(position.second, set())
        if position.local_index not in resolved:
            resolved.add(position.local_index)
            self._inflight -= 1
            self._bytes_out -= self._inflight_bytes.pop(position, 0)

    def next_cursor(self, wheel: Wheel, now_ms: int) -> tuple[Cursor, bool]:
        """How far the cursor may move, and whether only a newer stamp holds it back (then a
        cursor command, which carries one, is worth proposing even if the cursor is the same).
        """
        second, local_index = wheel.cursor
        for passed in [s for s in self._resolved if s < second]:
            del self._resolved[passed]
        closed_second = wheel.stamp_ms // MS_PER_SECOND
        while True:
            resolved = self._resolved.get(second)
            if resolved:
                while local_index in resolved:
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

    def done_runs(self, cursor: Cursor) -> tuple[DoneRun, ...]:
        """The resolved positions past ``cursor``, as runs, nearest first, at most
        ``max_synced_done_runs`` of them."""
        runs: list[DoneRun] = []
        for second in sorted(s for s in self._resolved if s >= cursor.second):
            floor = cursor.local_index if second == cursor.second else 0
            first = count = 0
            for local_index in sorted(i for i in self._resolved[second] if i >= floor):
                if count and local_index == first + count:
                    count += 1
                    continue
                if count:
                    runs.append(DoneRun(second, first, count))
                first, count = local_index, 1
            if count:
                runs.append(DoneRun(second, first, count))
            if len(runs) >= self._config.max_synced_done_runs:
                return tuple(runs[:self._config.max_synced_done_runs])
        return tuple(runs)

    def _resolve(self, positions: list[Cursor]) -> None:
        for second, local_index in positions:
            self._resolved.setdefault(second, set()).add(local_index)
