"""Applying what retires a pending message before its time: cancels and reschedules.

Both are ordered in the log with the handouts: a message that no group has leased is
cancelled (or moved) for good; one that some group leased is ``HANDED_OUT`` and stays as it
is. A reschedule retires the original as a cancel does and files a copy at the new time,
together; the client's handle then names the copy (`Stores.moves`), so later cancels and
reschedules follow it. The ledger's rows name who asked (``""``: a plain cancel or move).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tickwheel.common.errors import (
    CorruptSegment,
    Overloaded,
    PermissionDenied,
    UnknownHandle,
    invariant,
)
from tickwheel.replication import commands
from tickwheel.replication.ledger import LedgerRows
from tickwheel.replication.outcomes import Moved, MoveOutcome, Rejected
from tickwheel.replication.stores import Stores
from tickwheel.wheel import CancelResult, Cursor, DueMessage
from tickwheel.wheel.chains import GLOBAL_INDEX_BITS
from tickwheel.wheel.format import SECONDS_PER_HOUR, encode_record
from tickwheel.wheel.mending import Unmended

PASSED_HOURS = 2
"""How many hours behind the cursor a rescheduled message's handles are remembered."""


class Retiring:
    def __init__(self, stores: Stores, max_moved_msgs: int) -> None:
        self._s = stores
        self._max_moved_msgs = max_moved_msgs

    def apply_cancel(self, command: bytes, stamp_ms: int) -> list[CancelResult] | list[Rejected]:
        """Cancel each handle, in log order with the handouts: a message that no group ever
        leased is ``CANCELLED`` and never will be; one that some group leased is
        ``HANDED_OUT`` (the groups that did not lease it never will). A request naming an
        unknown handle changes nothing: one `Rejected` naming ``handles[i]``."""
        located = []
        handles, principal = commands.read_cancel(command)
        for i, handle in enumerate(handles):
            found = self._locate(handle, f"handles[{i}]")
            if isinstance(found, Rejected):
                return [found]
            located.append(found)
        results = [self._cancel_one(found) for found in located]
        if self._s.ledger is not None:
            for event, outcome in (("cancelled", CancelResult.CANCELLED),
                                   ("withdrawn", CancelResult.HANDED_OUT)):
                rows = [found[0] for found, result in zip(located, results, strict=True)
                        if found is not None and result is outcome]
                if rows:
                    self._s.ledger.add(LedgerRows(event, stamp_ms, {
                        "handle": [message.handle for message in rows],
                        "id": [message.id for message in rows],
                        "topic": [message.topic for message in rows],
                        "deliver_at_ms": [message.deliver_at_ms for message in rows],
                        "principal": [principal] * len(rows)}))
        return results

    def refused_topic(self, handles: Sequence[int], field: str,
                      may: Callable[[str], bool]) -> Rejected | None:
        """`Rejected` naming ``field.format(i)`` for the first handle whose message is of a
        topic ``may`` refuses; handles this replica cannot read are left to the command."""
        for index, handle in enumerate(handles):
            found = self._locate(handle, field)
            if found is not None and not isinstance(found, Rejected) and not may(
                    found[0].topic):
                return Rejected(PermissionDenied(field.format(index), "names a message of a "
                                                 "topic the caller may not change"))
        return None

    def _locate(self, handle: int, name: str) -> tuple[DueMessage, bool] | Rejected | None:
        """The message a client's handle names now (its latest copy, if it was moved) and
        whether it is tombstoned; None when its hour is behind the cursor."""
        current = self._s.moves.get(handle, handle)
        try:
            return self._s.wheel.handles.read(current)
        except UnknownHandle:
            if self._s.wheel.handles.is_behind(current):
                return None  # its hour is behind the cursor, and deleted
            return Rejected(UnknownHandle(name, f"{handle} was never returned by schedule"))
        except CorruptSegment as error:
            if isinstance(error, Unmended) and not error.everywhere:
                raise  # another replica has it: applying on without it would diverge
            return Rejected(UnknownHandle(name, f"{handle}: {error}"))

    def _cancel_one(self, found: tuple[DueMessage, bool] | None) -> CancelResult:
        if found is None:
            return CancelResult.NOT_PENDING
        message, tombstoned = found
        if tombstoned:
            return (CancelResult.NOT_PENDING if self._long_passed(message.handle)
                    else CancelResult.ALREADY_CANCELLED)
        position = message.position
        if not self._s.is_readied(position.second, position.local_index):
            outcome, tag = self._s.wheel.handles.cancel_tag(message.handle)
            if outcome is CancelResult.CANCELLED:
                self._s.pending.remove({tag: 1})
            return outcome
        never_leased = self._s.groups.cancel(message.handle, message.topic)
        if never_leased is None:
            return CancelResult.NOT_PENDING
        if not never_leased:
            return CancelResult.HANDED_OUT
        tag = self._s.wheel.handles.tombstone(message.handle)
        if position >= self._s.wheel.cursor:  # still counted pending: the cursor will not count it
            self._s.pending.remove({tag: 1})
        return CancelResult.CANCELLED

    def apply_move(self, command: bytes, stamp_ms: int) -> list[Moved] | list[Rejected]:
        """Move each pending message to its new due time: the original is retired as a cancel
        retires it (in log order with the handouts: a message some group leased stays put,
        ``HANDED_OUT``) and a copy is filed at the new time, together. The client's handle
        now names the copy (`moves`). A message already due at the asked time is left alone
        and answers ``RESCHEDULED``, so a repeated request files nothing. A request naming an
        unknown handle, a time too late, or more moved messages than ``max_moved_msgs``
        changes nothing: one `Rejected`."""
        stamp_ms = max(stamp_ms, self._s.wheel.stamp_ms)
        moves, principal = commands.read_move(command)
        latest_ms = stamp_ms + self._s.max_delay_ms
        located = []
        for i, (handle, deliver_at_ms) in enumerate(moves):
            if deliver_at_ms > latest_ms:
                return [self._s.too_late(deliver_at_ms, stamp_ms, f"moves[{i}].deliver_at_ms")]
            found = self._locate(handle, f"moves[{i}].handle")
            if isinstance(found, Rejected):
                return [found]
            located.append(found)
        new = {handle for handle, _ in moves} - self._s.moves.keys()
        if len(self._s.moves) + len(new) > self._max_moved_msgs:
            return [Rejected(Overloaded(
                f"max_moved_msgs: {len(self._s.moves)} rescheduled messages are remembered, at "
                f"most {self._max_moved_msgs}; retry once some are due"))]
        filed: list[tuple[DueMessage, int, int]] = []
        results = [self._move_one(handle, deliver_at_ms, found, stamp_ms, filed)
                   for (handle, deliver_at_ms), found in zip(moves, located, strict=True)]
        if self._s.ledger is not None and filed:
            self._s.ledger.add(LedgerRows("rescheduled", stamp_ms, {
                "handle": [message.handle for message, _, _ in filed],
                "id": [message.id for message, _, _ in filed],
                "topic": [message.topic for message, _, _ in filed],
                "old_deliver_at_ms": [message.deliver_at_ms for message, _, _ in filed],
                "new_handle": [copy for _, copy, _ in filed],
                "deliver_at_ms": [due_ms for _, _, due_ms in filed],
                "principal": [principal] * len(filed)}))
        return results

    def _move_one(self, handle: int, deliver_at_ms: int,
                  found: tuple[DueMessage, bool] | None, stamp_ms: int,
                  filed: list[tuple[DueMessage, int, int]]) -> Moved:
        if found is None:
            return Moved(MoveOutcome.NOT_PENDING, 0)
        message, tombstoned = found
        current = self._s.moves.get(handle, handle)
        if current != message.handle:  # moved by an earlier move of this same request
            found = self._s.wheel.handles.read(self._s.moves[handle])
            message, tombstoned = found
        if tombstoned:
            return Moved(MoveOutcome.NOT_PENDING if self._long_passed(message.handle)
                         else MoveOutcome.CANCELLED, 0)
        position = message.position
        readied = self._s.is_readied(position.second, position.local_index)
        if readied:
            never_leased = self._s.groups.never_leased(message.handle, message.topic)
            if never_leased is None:
                return Moved(MoveOutcome.NOT_PENDING, 0)
            if not never_leased:
                return Moved(MoveOutcome.HANDED_OUT, message.deliver_at_ms)
        if message.deliver_at_ms == deliver_at_ms:
            return Moved(MoveOutcome.RESCHEDULED, deliver_at_ms)  # there already: a repeat
        retired = self._cancel_one(found)
        invariant(retired is CancelResult.CANCELLED, f"a pending message's cancel: {retired}")
        record = encode_record(message.id, message.topic, message.body, deliver_at_ms,
                               message.properties, message.attempt)
        tags = self._s.tags([record])
        self._s.pending.add(tags)
        (copy,) = self._s.wheel.schedule_records([record], [deliver_at_ms], stamp_ms, tags)
        self._s.moves[handle] = copy
        filed.append((message, copy, deliver_at_ms))
        return Moved(MoveOutcome.RESCHEDULED, deliver_at_ms)

    def _long_passed(self, handle: int) -> bool:
        """Whether the hour of ``handle`` ended `PASSED_HOURS` or more before the cursor's.
        A tombstoned message reads ``NOT_PENDING`` then, not cancelled: it may be the original
        of a move that `forget_moves` has forgotten. (A cancel repeated within the hour
        after still reads ``ALREADY_CANCELLED``.)"""
        return ((handle >> GLOBAL_INDEX_BITS) + PASSED_HOURS
                <= self._s.wheel.cursor.second // SECONDS_PER_HOUR)

    def forget_moves(self, cursor: Cursor) -> None:
        """Forget the moves whose two handles' hours ended `PASSED_HOURS` or more before the
        cursor's and before any message a group still holds: nothing of them is pending, and
        either handle then reads ``NOT_PENDING`` (`_long_passed`)."""
        horizon = cursor.second // SECONDS_PER_HOUR
        oldest_held = self._s.groups.oldest_hour()
        if oldest_held is not None:
            horizon = min(horizon, oldest_held)
        passed = [handle for handle, copy in self._s.moves.items()
                  if (max(handle, copy) >> GLOBAL_INDEX_BITS) + PASSED_HOURS <= horizon]
        for handle in passed:
            del self._s.moves[handle]
