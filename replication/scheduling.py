"""Applying what files messages: schedules, and the retry copies of retries and reschedules.

A schedule files every message whose id is new; an id the dedupe window remembers (also one
repeated within the entry) answers its first scheduling's result, flagged ``duplicate``. A
retry or a first-wave reschedule retires the message it copies and files the copy together,
so a replica holds one or the other, never neither, and never both. The ledger's ``scheduled``
rows name who asked for each message filed (``""`` when the entry does not: a ``schedule``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from itertools import repeat
from typing import TypeVar

from tickwheel.common.errors import CorruptSegment, InvariantViolation, UnknownHandle, invariant
from tickwheel.replication import commands
from tickwheel.replication.commands import LeaseRef
from tickwheel.replication.ledger import LedgerRows
from tickwheel.replication.outcomes import Accepted, Rejected, Retried
from tickwheel.replication.stores import Stores
from tickwheel.wheel import CancelResult

_Copy = TypeVar("_Copy", commands.LeasedRetry, commands.RetryRecord)
"""A retry copy of a command: a leased message's (``retry``), or a first-wave
``reschedule``'s."""


class Scheduling:
    def __init__(self, stores: Stores) -> None:
        self._s = stores

    def apply_schedule(self, command: bytes, stamp_ms: int) -> list[Accepted | Rejected]:
        """File every message whose id is new; a remembered id (also one repeated within the
        entry) returns its first result, flagged ``duplicate``."""
        stamp_ms = max(stamp_ms, self._s.wheel.stamp_ms)
        self._s.dedupe.forget_expired(stamp_ms)
        due_ms, keys, records, principals = commands.read_schedule(command)
        unique_keys = set(keys)
        remembered = self._s.dedupe.remembered(unique_keys)
        latest_ms = stamp_ms + self._s.max_delay_ms
        if (remembered or len(unique_keys) != len(keys)
                or max(due_ms, default=latest_ms) > latest_ms):
            return self.apply_schedule_mixed(due_ms, keys, records, stamp_ms, remembered,
                                             principals)
        # The usual entry, every message new and in time: filed column by column.
        handles = self._file(records, due_ms, keys, stamp_ms, principals)
        # tuple.__new__: a NamedTuple's own constructor is a Python call per message
        return list(map(partial(tuple.__new__, Accepted), zip(handles, due_ms, repeat(False))))

    def apply_schedule_mixed(self, due_ms: list[int], keys: list[bytes],
                              records: list[bytes], stamp_ms: int,
                              remembered: dict[bytes, tuple[int, int]],
                              principals: list[str]) -> list[Accepted | Rejected]:
        """`apply_schedule` of an entry with retried ids or messages due too late, message by
        message."""
        results: list[Accepted | Rejected | bytes | None] = []
        first_at: dict[bytes, int] = {}
        new_records, new_due_ms, new_keys, new_principals = [], [], [], []
        latest_ms = stamp_ms + self._s.max_delay_ms
        for deliver_at_ms, key, record, principal in zip(due_ms, keys, records, principals,
                                                         strict=True):
            earlier = remembered.get(key)
            if earlier is not None:
                results.append(Accepted(*self._due_now(*earlier), duplicate=True))
            elif key in first_at:
                results.append(key)  # the first one's result, once it is filed
            elif deliver_at_ms > latest_ms:
                results.append(self._s.too_late(deliver_at_ms, stamp_ms))
            else:
                first_at[key] = len(results)
                results.append(None)
                new_records.append(record)
                new_due_ms.append(deliver_at_ms)
                new_keys.append(key)
                new_principals.append(principal)
        handles = self._file(new_records, new_due_ms, new_keys, stamp_ms, new_principals)
        for key, handle, deliver_at_ms in zip(new_keys, handles, new_due_ms, strict=True):
            results[first_at[key]] = Accepted(handle, deliver_at_ms, duplicate=False)
        return [_filled(result, results, first_at) for result in results]

    def _due_now(self, handle: int, deliver_at_ms: int) -> tuple[int, int]:
        """A remembered schedule's handle and when its message is due now: a rescheduled
        one's latest copy's time (the first time, once the copy's hour is gone)."""
        copy = self._s.moves.get(handle)
        if copy is None:
            return handle, deliver_at_ms
        try:
            return handle, self._s.wheel.handles.read(copy)[0].deliver_at_ms
        except (UnknownHandle, CorruptSegment):
            return handle, deliver_at_ms

    def _file(self, records: list[bytes], due_ms: list[int], keys: list[bytes],
              stamp_ms: int, principals: list[str]) -> list[int]:
        """File new messages: in the wheel under their topics' tags, counted pending, and
        remembered by id. Returns their handles."""
        tags = self._s.tags(records)
        handles = self._s.wheel.schedule_records(records, due_ms, stamp_ms, tags)
        self._s.pending.add(tags)
        self._s.dedupe.add_many(keys, handles, due_ms, stamp_ms)
        if self._s.ledger is not None and handles:
            self._s.ledger.add(LedgerRows("scheduled", stamp_ms, {
                "handle": handles, "deliver_at_ms": due_ms, "principal": principals}, records))
        return handles

    def apply_reschedule(self, command: bytes, stamp_ms: int) -> list[Retried | Rejected]:
        """Retire each delivered message (a tombstone, so no pass hands it out again and the
        cursor counts it done) and file its retry copy, together: a replica that applied this
        holds the copy, one that did not still holds the original. Never neither.

        The tombstone is also the idempotence key: only the command that retires the original
        files a copy, so a message nacked twice (once per leader, across a failover) is copied
        once. The dedupe window is not consulted: the copy keeps the id that window remembers,
        and would otherwise be swallowed as a retried schedule."""
        def retire(retry: commands.RetryRecord) -> Retried | Rejected | None:
            try:
                retired, tag = self._s.wheel.handles.cancel_tag(retry.replaces_handle)
            except UnknownHandle as error:
                return Rejected(error)
            if retired is not CancelResult.CANCELLED:
                return Retried(None, retry.deliver_at_ms)
            # The copy is counted at once: a later original of the loop may take its topic's
            # count to zero and free the tag, which another topic would then get.
            self._s.pending.remove({tag: 1})
            return None
        return self._file_copies(commands.read_reschedule(command), retire, stamp_ms)

    def _file_copies(self, copies: Iterable[_Copy],
                     retire: Callable[[_Copy], Retried | Rejected | None],
                     stamp_ms: int) -> list[Retried | Rejected]:
        """File a copy of each message whose original ``retire`` ends (it returns None);
        else answer what it returns. One wheel append for every copy of the command."""
        stamp_ms = max(stamp_ms, self._s.wheel.stamp_ms)
        latest_ms = stamp_ms + self._s.max_delay_ms
        results: list[Retried | Rejected | None] = []
        records, due_ms, filed_at, tags = [], [], [], []
        for copy in copies:
            if copy.deliver_at_ms > latest_ms:
                results.append(self._s.too_late(copy.deliver_at_ms, stamp_ms))
                continue
            instead = retire(copy)
            if instead is not None:
                results.append(instead)
                continue
            tags += self._s.tags([copy.record])
            self._s.pending.add(tags[-1:])
            filed_at.append(len(results))
            results.append(None)
            records.append(copy.record)
            due_ms.append(copy.deliver_at_ms)
        handles = self._s.wheel.schedule_records(records, due_ms, stamp_ms, tags)
        for index, handle, deliver_at_ms in zip(filed_at, handles, due_ms, strict=True):
            results[index] = Retried(handle, deliver_at_ms)
        filled = [result for result in results if result is not None]
        invariant(len(filled) == len(results), "a copy's result was never filled in")
        return filled

    def apply_retry(self, command: bytes, stamp_ms: int) -> list[Retried | Rejected]:
        """Resolve each leased message and file its retry copy, together: a replica that
        applied this holds the copy, one that did not still holds the lease. The receipt is
        the idempotence key: a lease retried once (or acked) is not copied again."""
        retired: list[tuple[LeaseRef, str | None, bytes]] = []
        groups = self._s.groups

        def retire(retry: commands.LeasedRetry) -> Retried | None:
            group = groups.by_id(retry.lease.group_id)  # before it may go away with the lease
            if not groups.resolve(retry.lease):
                return Retried(None, retry.deliver_at_ms)
            if self._s.ledger is not None:
                retired.append((retry.lease, None if group is None else group.name,
                                retry.record))
            return None
        results = self._file_copies(commands.read_retry(command), retire, stamp_ms)
        if self._s.ledger is not None and retired:
            filed = [r for r in results if isinstance(r, Retried) and r.handle is not None]
            self._s.ledger.add(LedgerRows("nacked", max(stamp_ms, self._s.wheel.stamp_ms), {
                "handle": [lease.handle for lease, _, _ in retired],
                "group": [group for _, group, _ in retired],
                "lease": [lease.seq for lease, _, _ in retired],
                "new_handle": [r.handle for r in filed],
                "deliver_at_ms": [r.deliver_at_ms for r in filed]},
                [record for _, _, record in retired]))
        return results


def _filled(result: Accepted | Rejected | bytes | None,
            results: list[Accepted | Rejected | bytes | None],
            first_at: dict[bytes, int]) -> Accepted | Rejected:
    """A result, with a repeat within the entry turned into its first occurrence's."""
    if isinstance(result, bytes):
        first = results[first_at[result]]
        if not isinstance(first, Accepted):
            raise InvariantViolation("a repeated id's first result is missing")
        return first._replace(duplicate=True)
    if result is None:
        raise InvariantViolation("a schedule result was never filled in")
    return result
