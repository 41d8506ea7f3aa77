"""The replicated state machine: the wheel plus the dedupe window, changed only by commands.

Every replica applies the same commands in the same order and so holds byte-identical files.
All its state is append-only files plus a cursor and a stamp, which is what makes snapshots
cheap: a `Manifest` lists each file's *length*, never its bytes (`state_files`). What each
command answers is in `outcomes`.

Single-threaded: the Raft thread owns it (applies, snapshots, installs).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import TypeVar

from tickwheel.common.errors import (
    CorruptSegment,
    InvalidMessage,
    Overloaded,
    PermissionDenied,
    UnknownHandle,
    invariant,
)
from tickwheel.replication import commands
from tickwheel.replication.commands import Kind, LeaseOp
from tickwheel.replication.dedupe import DedupeWindow
from tickwheel.replication.groups import Groups
from tickwheel.replication.outcomes import Accepted, Moved, MoveOutcome, Rejected, Retried
from tickwheel.replication.pending import PendingCounts
from tickwheel.replication.state_files import (
    DEDUPE,
    WHEEL,
    Fetch,
    Manifest,
    copies_under,
    restore_files,
)
from tickwheel.wheel import CancelResult, Cursor, DueMessage, Wheel
from tickwheel.wheel.format import SECONDS_PER_HOUR, encode_record, record_topics
from tickwheel.wheel.mending import CopySource, MendCounts, Unmended
from tickwheel.wheel.types import WheelConfig
from tickwheel.wheel.window import GLOBAL_INDEX_BITS

_Copy = TypeVar("_Copy", commands.LeasedRetry, commands.RetryRecord)
"""A retry copy of a command: a leased message's (``retry``), or a first-wave
``reschedule``'s."""

log = logging.getLogger("tickwheel.replication.state")

PASSED_HOURS = 2
"""How many hours behind the cursor a rescheduled message's handles are remembered."""



@dataclass(frozen=True, slots=True)
class StateConfig:
    wheel: WheelConfig = field(default_factory=WheelConfig)
    dedupe_window_ms: int = 600_000
    """How long (in leader stamp time) a scheduled id is remembered."""
    max_dedupe_ids: int = 2_000_000
    """At most this many ids are remembered (about 130 bytes each); the oldest go first."""
    max_tracked_topics: int = 1_024
    """Topics whose pending messages are counted by name; messages of further topics are
    counted together as untracked (`tickwheel.replication.pending`)."""
    max_ready_msgs: int = 100_000
    """Due messages a consumer group holds for its consumers; past it the oldest that no
    consumer has leased are dropped (logged, counted): the retention of a group nobody reads."""
    max_groups: int = 1_024
    """Consumer groups, over all topics."""
    max_moved_msgs: int = 100_000
    """Rescheduled messages whose handles are remembered (while the hour of the handle, or
    of the message's new due time, is ahead of the cursor); beyond it a reschedule of a
    message not moved before is refused (``RESOURCE_EXHAUSTED``)."""


class StateMachine:
    """The state machine. Open with `StateMachine.open`; `apply` commands; `close` at the end."""

    def __init__(self, root: Path, config: StateConfig, copies: CopySource | None = None) -> None:
        self._root = root
        self._config = config
        self._copies = copies
        self.mended = MendCounts()
        """What mending did to the wheel's files since the node started (over reopens)."""
        self.wheel, self.dedupe = self._open_files()
        self.pending = PendingCounts(config.max_tracked_topics)
        self.groups = Groups(config.max_ready_msgs, config.max_groups)
        self.readied: dict[int, set[int]] = {}
        """Positions at or past the cursor that a handout readied: they have left the wheel
        for their groups (a new leader does not take them again). Per second, local
        indexes; the cursor passes them once their second is complete."""
        self.handle_key: bytes | None = None
        """The key of the handles clients see (`tickwheel.replication.handles`), set by the
        first barrier."""
        self.moves: dict[int, int] = {}
        """Rescheduled messages: the handle Schedule returned -> the handle of the copy filed
        at the new due time. Clients keep their handle; cancels and reschedules follow this.
        Kept while either handle's hour is ahead of the cursor (`_forget_moves`)."""
        self._last_manifest: Manifest | None = None

    @classmethod
    def open(cls, root: Path, config: StateConfig, *, fresh: bool,
             copies: CopySource | None = None) -> StateMachine:
        """Open the state under ``root``. ``fresh``: no snapshot exists, so the Raft journal
        will replay from its first entry, and whatever files are here must go first.
        ``copies``: other replicas' copies of the state files (paths relative to ``root``), where
        a damaged record, index unit or tombstone of the wheel is mended from."""
        if fresh and root.exists():
            log.info("event=state_reset root=%s reason=no_snapshot", root)
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        return cls(root, config, copies)

    @property
    def cursor(self) -> Cursor:
        return self.wheel.cursor

    @property
    def stamp_ms(self) -> int:
        return self.wheel.stamp_ms

    @property
    def readied_past_cursor(self) -> int:
        """How many messages at or past the cursor have left the wheel for their groups."""
        return sum(map(len, list(self.readied.values())))

    # -- applying commands ----------------------------------------------------------------

    def apply(self, command: bytes) -> object:
        """Apply one command; returns what its proposer gets back (see each ``_apply_*``)."""
        kind, stamp_ms = commands.read_header(command)
        if kind is Kind.SCHEDULE:
            return self._apply_schedule(command, stamp_ms)
        if kind is Kind.HANDOUT:
            return self._apply_handout(command, stamp_ms)
        if kind is Kind.LEASES:
            return self._apply_leases(command)
        if kind is Kind.RETRY:
            return self._apply_retry(command, stamp_ms)
        if kind is Kind.CANCEL:
            return self._apply_cancel(command)
        if kind is Kind.MOVE:
            return self._apply_move(command, stamp_ms)
        if kind is Kind.GROUP:
            return self._apply_group(command, stamp_ms)
        if kind is Kind.RESCHEDULE:
            return self._apply_reschedule(command, stamp_ms)
        if kind is Kind.BARRIER:
            return self._apply_barrier(command, stamp_ms)
        return self._apply_cursor(commands.read_cursor(command), stamp_ms)

    def _apply_barrier(self, command: bytes, stamp_ms: int) -> Cursor:
        """A new leader took office: its predecessor's stream leases end, and the cluster
        gets its handle key if it has none."""
        position, key = commands.read_barrier(command)
        released = self.groups.release_streams()
        if released:
            log.info("event=stream_leases_released leases=%d", released)
        if key is not None and self.handle_key is None:
            self.handle_key = key
            log.info("event=handle_key_set")
        return self._apply_cursor(position, stamp_ms)

    def _apply_schedule(self, command: bytes, stamp_ms: int) -> list[Accepted | Rejected]:
        """File every message whose id is new; a remembered id (also one repeated within the
        entry) returns its first result, flagged ``duplicate``."""
        stamp_ms = max(stamp_ms, self.wheel.stamp_ms)
        self.dedupe.forget_expired(stamp_ms)
        due_ms, keys, records = commands.read_schedule(command)
        unique_keys = set(keys)
        remembered = self.dedupe.remembered(unique_keys)
        latest_ms = stamp_ms + self._config.wheel.max_delay_ms
        if (remembered or len(unique_keys) != len(keys)
                or max(due_ms, default=latest_ms) > latest_ms):
            return self._apply_schedule_mixed(due_ms, keys, records, stamp_ms, remembered)
        # The usual entry, every message new and in time: filed column by column.
        handles = self._file(records, due_ms, keys, stamp_ms)
        return list(map(Accepted, handles, due_ms, repeat(False)))

    def _apply_schedule_mixed(self, due_ms: list[int], keys: list[bytes],
                              records: list[bytes], stamp_ms: int,
                              remembered: dict[bytes, tuple[int, int]],
                              ) -> list[Accepted | Rejected]:
        """`_apply_schedule` of an entry with retried ids or messages due too late, message by
        message."""
        results: list[Accepted | Rejected | bytes | None] = []
        first_at: dict[bytes, int] = {}
        new_records, new_due_ms, new_keys = [], [], []
        latest_ms = stamp_ms + self._config.wheel.max_delay_ms
        for deliver_at_ms, key, record in zip(due_ms, keys, records, strict=True):
            earlier = remembered.get(key)
            if earlier is not None:
                results.append(Accepted(*self._due_now(*earlier), duplicate=True))
            elif key in first_at:
                results.append(key)  # the first one's result, once it is filed
            elif deliver_at_ms > latest_ms:
                results.append(self._too_late(deliver_at_ms, stamp_ms))
            else:
                first_at[key] = len(results)
                results.append(None)
                new_records.append(record)
                new_due_ms.append(deliver_at_ms)
                new_keys.append(key)
        handles = self._file(new_records, new_due_ms, new_keys, stamp_ms)
        for key, handle, deliver_at_ms in zip(new_keys, handles, new_due_ms, strict=True):
            results[first_at[key]] = Accepted(handle, deliver_at_ms, duplicate=False)
        return [_filled(result, results, first_at) for result in results]

    def _due_now(self, handle: int, deliver_at_ms: int) -> tuple[int, int]:
        """A remembered schedule's handle and when its message is due now: a rescheduled
        one's latest copy's time (the first time, once the copy's hour is gone)."""
        copy = self.moves.get(handle)
        if copy is None:
            return handle, deliver_at_ms
        try:
            return handle, self.wheel.read(copy)[0].deliver_at_ms
        except (UnknownHandle, CorruptSegment):
            return handle, deliver_at_ms

    def _file(self, records: list[bytes], due_ms: list[int], keys: list[bytes],
              stamp_ms: int) -> list[int]:
        """File new messages: in the wheel under their topics' tags, counted pending, and
        remembered by id. Returns their handles."""
        tags = self._tags(records)
        handles = self.wheel.schedule_records(records, due_ms, stamp_ms, tags)
        self.pending.add(tags)
        self.dedupe.add_many(keys, handles, due_ms, stamp_ms)
        return handles

    def _tags(self, records: list[bytes]) -> list[int]:
        """The pending tag of each record's topic. Each tag handed out must be counted before
        any count is removed (a count at zero frees its tag). Topics get their tags in order of
        first appearance, the same on every replica."""
        topics = record_topics(records)
        tag_of = {topic: self.pending.tag_for(topic.decode()) for topic in dict.fromkeys(topics)}
        return list(map(tag_of.__getitem__, topics))

    def _apply_reschedule(self, command: bytes, stamp_ms: int) -> list[Retried | Rejected]:
        """Retire each delivered message (a tombstone, so no pass hands it out again and the
        cursor counts it done) and file its retry copy, together: a replica that applied this
        holds the copy, one that did not still holds the original. Never neither.

        The tombstone is also the idempotence key: only the command that retires the original
        files a copy, so a message nacked twice (once per leader, across a failover) is copied
        once. The dedupe window is not consulted: the copy keeps the id that window remembers,
        and would otherwise be swallowed as a retried schedule."""
        def retire(retry: commands.RetryRecord) -> Retried | Rejected | None:
            try:
                retired, tag = self.wheel.cancel_tag(retry.replaces_handle)
            except UnknownHandle as error:
                return Rejected(error)
            if retired is not CancelResult.CANCELLED:
                return Retried(None, retry.deliver_at_ms)
            # The copy is counted at once: a later original of the loop may take its topic's
            # count to zero and free the tag, which another topic would then get.
            self.pending.remove({tag: 1})
            return None
        return self._file_copies(commands.read_reschedule(command), retire, stamp_ms)

    def _file_copies(self, copies: Iterable[_Copy],
                     retire: Callable[[_Copy], Retried | Rejected | None],
                     stamp_ms: int) -> list[Retried | Rejected]:
        """File a copy of each message whose original ``retire`` ends (it returns None);
        else answer what it returns. One wheel append for every copy of the command."""
        stamp_ms = max(stamp_ms, self.wheel.stamp_ms)
        latest_ms = stamp_ms + self._config.wheel.max_delay_ms
        results: list[Retried | Rejected | None] = []
        records, due_ms, filed_at, tags = [], [], [], []
        for copy in copies:
            if copy.deliver_at_ms > latest_ms:
                results.append(self._too_late(copy.deliver_at_ms, stamp_ms))
                continue
            instead = retire(copy)
            if instead is not None:
                results.append(instead)
                continue
            tags += self._tags([copy.record])
            self.pending.add(tags[-1:])
            filed_at.append(len(results))
            results.append(None)
            records.append(copy.record)
            due_ms.append(copy.deliver_at_ms)
        handles = self.wheel.schedule_records(records, due_ms, stamp_ms, tags)
        for index, handle, deliver_at_ms in zip(filed_at, handles, due_ms, strict=True):
            results[index] = Retried(handle, deliver_at_ms)
        invariant(None not in results, "a copy's result was never filled in")
        return results

    def _too_late(self, deliver_at_ms: int, stamp_ms: int,
                  field: str = "deliver_at_ms") -> Rejected:
        return Rejected(InvalidMessage(field, (
            f"{deliver_at_ms} is more than {self._config.wheel.max_delay_ms} ms after "
            f"{stamp_ms}")))

    def _apply_cancel(self, command: bytes) -> list[CancelResult] | list[Rejected]:
        """Cancel each handle, in log order with the handouts: a message that no group ever
        leased is ``CANCELLED`` and never will be; one that some group leased is
        ``HANDED_OUT`` (the groups that did not lease it never will). A request naming an
        unknown handle changes nothing: one `Rejected` naming ``handles[i]``."""
        located = []
        for i, handle in enumerate(commands.read_cancel(command)):
            found = self._locate(handle, f"handles[{i}]")
            if isinstance(found, Rejected):
                return [found]
            located.append(found)
        return [self._cancel_one(found) for found in located]

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
        current = self.moves.get(handle, handle)
        try:
            return self.wheel.read(current)
        except UnknownHandle:
            if self.wheel.is_behind(current):
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
        if not self._readied(position.second, position.local_index):
            outcome, tag = self.wheel.cancel_tag(message.handle)
            if outcome is CancelResult.CANCELLED:
                self.pending.remove({tag: 1})
            return outcome
        never_leased = self.groups.cancel(message.handle, message.topic)
        if never_leased is None:
            return CancelResult.NOT_PENDING
        if not never_leased:
            return CancelResult.HANDED_OUT
        tag = self.wheel.tombstone(message.handle)
        if position >= self.wheel.cursor:  # still counted pending: the cursor will not count it
            self.pending.remove({tag: 1})
        return CancelResult.CANCELLED

    def _apply_move(self, command: bytes, stamp_ms: int) -> list[Moved] | list[Rejected]:
        """Move each pending message to its new due time: the original is retired as a cancel
        retires it (in log order with the handouts: a message some group leased stays put,
        ``HANDED_OUT``) and a copy is filed at the new time, together. The client's handle
        now names the copy (`moves`). A message already due at the asked time is left alone
        and answers ``RESCHEDULED``, so a repeated request files nothing. A request naming an
        unknown handle, a time too late, or more moved messages than ``max_moved_msgs``
        changes nothing: one `Rejected`."""
        stamp_ms = max(stamp_ms, self.wheel.stamp_ms)
        moves = commands.read_move(command)
        latest_ms = stamp_ms + self._config.wheel.max_delay_ms
        located = []
        for i, (handle, deliver_at_ms) in enumerate(moves):
            if deliver_at_ms > latest_ms:
                return [self._too_late(deliver_at_ms, stamp_ms, f"moves[{i}].deliver_at_ms")]
            found = self._locate(handle, f"moves[{i}].handle")
            if isinstance(found, Rejected):
                return [found]
            located.append(found)
        new = {handle for handle, _ in moves} - self.moves.keys()
        if len(self.moves) + len(new) > self._config.max_moved_msgs:
            return [Rejected(Overloaded(
                f"max_moved_msgs: {len(self.moves)} rescheduled messages are remembered, at "
                f"most {self._config.max_moved_msgs}; retry once some are due"))]
        return [self._move_one(handle, deliver_at_ms, found, stamp_ms)
                for (handle, deliver_at_ms), found in zip(moves, located, strict=True)]

    def _move_one(self, handle: int, deliver_at_ms: int,
                  found: tuple[DueMessage, bool] | None, stamp_ms: int) -> Moved:
        if found is None:
            return Moved(MoveOutcome.NOT_PENDING, 0)
        message, tombstoned = found
        current = self.moves.get(handle, handle)
        if current != message.handle:  # moved by an earlier move of this same request
            found = self.wheel.read(self.moves[handle])
            message, tombstoned = found
        if tombstoned:
            return Moved(MoveOutcome.NOT_PENDING if self._long_passed(message.handle)
                         else MoveOutcome.CANCELLED, 0)
        position = message.position
        readied = self._readied(position.second, position.local_index)
        if readied:
            never_leased = self.groups.never_leased(message.handle, message.topic)
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
        tags = self._tags([record])
        self.pending.add(tags)
        (copy,) = self.wheel.schedule_records([record], [deliver_at_ms], stamp_ms, tags)
        self.moves[handle] = copy
        return Moved(MoveOutcome.RESCHEDULED, deliver_at_ms)

    def _long_passed(self, handle: int) -> bool:
        """Whether the hour of ``handle`` ended `PASSED_HOURS` or more before the cursor's.
        A tombstoned message reads ``NOT_PENDING`` then, not cancelled: it may be the original
        of a move that `_forget_moves` has forgotten. (A cancel repeated within the hour
        after still reads ``ALREADY_CANCELLED``.)"""
        return ((handle >> GLOBAL_INDEX_BITS) + PASSED_HOURS
                <= self.wheel.cursor.second // SECONDS_PER_HOUR)

    def _forget_moves(self, cursor: Cursor) -> None:
        """Forget the moves whose two handles' hours ended `PASSED_HOURS` or more before the
        cursor's and before any message a group still holds: nothing of them is pending, and
        either handle then reads ``NOT_PENDING`` (`_long_passed`)."""
        horizon = cursor.second // SECONDS_PER_HOUR
        oldest_held = self.groups.oldest_hour()
        if oldest_held is not None:
            horizon = min(horizon, oldest_held)
        passed = [handle for handle, copy in self.moves.items()
                  if (max(handle, copy) >> GLOBAL_INDEX_BITS) + PASSED_HOURS <= horizon]
        for handle in passed:
            del self.moves[handle]

    def _apply_handout(self, command: bytes, stamp_ms: int) -> list[int]:
        """Ready the messages that came due (not one cancelled since the leader took it), then
        grant the leases: per grant its sequence number, or 0 when the message is not ready
        in that group (cancelled, dropped, leased already)."""
        stamp_ms = max(stamp_ms, self.wheel.stamp_ms)
        ready, grants = commands.read_handout(command)
        wheel, groups, readied = self.wheel, self.groups, self.readied
        for item in ready:
            if wheel.is_cancelled(item.handle) or self._readied(item.second, item.local_index):
                continue  # cancelled meanwhile, or readied already (a handout proposed twice)
            readied.setdefault(item.second, set()).add(item.local_index)
            groups.ready(item.handle, item.topic, item.target, stamp_ms)
        results = []
        for grant in grants:
            group = groups.get(grant.topic, grant.group)
            results.append(0 if group is None else groups.grant(
                group, grant.handle, grant.nonce, grant.deadline_ms, grant.mode))
        return results

    def _readied(self, second: int, local_index: int) -> bool:
        """Whether the message at this position has left the wheel for its groups: behind the
        cursor, or readied past it."""
        return ((second, local_index) < self.wheel.cursor
                or local_index in self.readied.get(second, ()))

    def _apply_leases(self, command: bytes) -> list[bool]:
        """Acks, releases or new deadlines, each of a genuine current receipt (else False and
        nothing changes)."""
        op, refs = commands.read_leases(command)
        groups = self.groups
        if op is LeaseOp.ACK:
            return [groups.resolve(ref) for ref, _ in refs]
        if op is LeaseOp.RELEASE:
            return [groups.release(ref) for ref, _ in refs]
        if op is LeaseOp.RETURN:
            return [groups.give_back(ref) for ref, _ in refs]
        return [groups.extend(ref, deadline_ms) for ref, deadline_ms in refs]

    def _apply_group(self, command: bytes, stamp_ms: int) -> bool:
        """Create (True if it exists now, or is an implicit default group) or delete (True if
        it existed) a group."""
        create, topic, name = commands.read_group(command)
        if create:
            return self.groups.create(topic, name, max(stamp_ms, self.wheel.stamp_ms))
        return self.groups.delete(topic, name)

    def _apply_retry(self, command: bytes, stamp_ms: int) -> list[Retried | Rejected]:
        """Resolve each leased message and file its retry copy, together: a replica that
        applied this holds the copy, one that did not still holds the lease. The receipt is
        the idempotence key: a lease retried once (or acked) is not copied again."""
        def retire(retry: commands.LeasedRetry) -> Retried | None:
            return None if self.groups.resolve(retry.lease) else Retried(None,
                                                                         retry.deliver_at_ms)
        return self._file_copies(commands.read_retry(command), retire, stamp_ms)

    def _apply_cursor(self, proposed: Cursor, stamp_ms: int) -> Cursor:
        """Move the cursor, and the stamp. A cursor behind the current one is a stale proposal
        (a deposed leader's, committed after its successor's): it is ignored, everywhere.
        The messages it passes are no longer pending (they are in their groups)."""
        position = max(proposed, self.wheel.cursor)
        self.pending.remove(self.wheel.live_tags_until(position))
        hour = self.wheel.cursor.second // SECONDS_PER_HOUR
        self.wheel.advance_cursor(position, stamp_ms)
        self._forget_readied(self.wheel.cursor)
        if self.moves and self.wheel.cursor.second // SECONDS_PER_HOUR != hour:
            self._forget_moves(self.wheel.cursor)
        return self.wheel.cursor

    def _forget_readied(self, cursor: Cursor) -> None:
        for second in [s for s in self.readied if s < cursor.second]:
            del self.readied[second]
        at_cursor = self.readied.get(cursor.second)
        if at_cursor:
            at_cursor.difference_update([i for i in at_cursor if i < cursor.local_index])
            if not at_cursor:
                del self.readied[cursor.second]

    # -- snapshots --------------------------------------------------------------------------

    def manifest(self) -> Manifest:
        """Flush everything and list it. Cost: one ``stat`` per file, never the data."""
        files = {f"{WHEEL}/{path}": size
                 for path, size in self.wheel.files(self.groups.oldest_hour()).items()}
        files.update({f"{DEDUPE}/{path}": size for path, size in self.dedupe.files().items()})
        return Manifest(self.wheel.cursor, self.wheel.stamp_ms, files, self.pending.snapshot(),
                        self.groups.snapshot(),
                        {second: set(indexes) for second, indexes in self.readied.items()},
                        self.handle_key, dict(self.moves))

    def snapshot_written(self, manifest: Manifest) -> None:
        """``manifest`` is now the Raft snapshot: delete passed hours and forgotten dedupe
        buckets that neither it nor the snapshot before it names (a follower may still be
        fetching against the older one)."""
        named = set(manifest.files)
        if self._last_manifest is not None:
            named |= set(self._last_manifest.files)
        for hour in self.wheel.passed_hours():
            if not any(path.startswith(f"{WHEEL}/hours/{hour:08d}/") for path in named):
                self.wheel.delete_hour(hour)
        for name in self.dedupe.forgotten_files():
            if f"{DEDUPE}/{name}" not in named:
                self.dedupe.delete_file(name)
        self._last_manifest = manifest

    def install(self, manifest: Manifest, fetch: Fetch) -> None:
        """Make the files exactly those of ``manifest``: cut what is longer, delete what it
        does not name, fetch from a peer what is missing; then reopen."""
        self.close()
        fetched = restore_files(self._root, manifest.files, fetch)
        self.wheel, self.dedupe = self._open_files()
        self.wheel.reset_to(manifest.cursor, manifest.stamp_ms)
        self.pending.restore(manifest.pending)
        self.groups.restore(manifest.groups)
        self.readied = {second: set(indexes) for second, indexes in manifest.readied.items()}
        self.handle_key = manifest.handle_key
        self.moves = dict(manifest.moves)
        self._last_manifest = manifest
        log.info("event=snapshot_installed files=%d fetched_bytes=%d cursor_second=%d "
                 "cursor_local_index=%d", len(manifest.files), fetched, *manifest.cursor)

    def close(self) -> None:
        self.wheel.close()
        self.dedupe.close()

    def _open_files(self) -> tuple[Wheel, DedupeWindow]:
        wheel_copies = None if self._copies is None else partial(copies_under, self._copies,
                                                                 WHEEL)
        return (Wheel.open(self._root / WHEEL, self._config.wheel, replicated=True,
                           copies=wheel_copies, mend_counts=self.mended),
                DedupeWindow.open(self._root / DEDUPE, self._config.dedupe_window_ms,
                                  self._config.max_dedupe_ids))


def _filled(result: Accepted | Rejected | bytes | None,
            results: list[Accepted | Rejected | bytes | None],
            first_at: dict[bytes, int]) -> Accepted | Rejected:
    """A result, with a repeat within the entry turned into its first occurrence's."""
    if isinstance(result, bytes):
        first = results[first_at[result]]
        invariant(isinstance(first, Accepted), "a repeated id's first result is missing")
        return first._replace(duplicate=True)
    invariant(result is not None, "a schedule result was never filled in")
    return result
