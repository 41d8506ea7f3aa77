"""The replicated state machine: the wheel plus the dedupe window, changed only by commands.

Every replica applies the same commands in the same order and so holds byte-identical files.
All its state is append-only files plus a cursor and a stamp, which is what makes snapshots
cheap: a `Manifest` lists each file's *length*, never its bytes (`state_files`). What each
command answers is in `outcomes`.

Single-threaded: the Raft thread owns it (applies, snapshots, installs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pyroaring import BitMap

from tickwheel.common.errors import invariant
from tickwheel.common.versions import BASELINE, CURRENT, describe
from tickwheel.replication import commands
from tickwheel.replication.commands import Kind, LeaseOp
from tickwheel.replication.dedupe import DedupeWindow
from tickwheel.replication.groups import Groups
from tickwheel.replication.ledger import LedgerRows, LedgerSink
from tickwheel.replication.outcomes import Rejected
from tickwheel.replication.pending import PendingCounts
from tickwheel.replication.retiring import Retiring
from tickwheel.replication.scheduling import Scheduling
from tickwheel.replication.staging import remove_state
from tickwheel.replication.state_files import (
    DEDUPE,
    WHEEL,
    Fetch,
    FetchMany,
    Manifest,
    ShardMapRecord,
    copies_under,
    restore_files,
)
from tickwheel.replication.stores import Stores
from tickwheel.wheel import Cursor, DueHistogram, Wheel
from tickwheel.wheel.format import SECONDS_PER_HOUR
from tickwheel.wheel.mending import CopySource, MendCounts
from tickwheel.wheel.types import WheelConfig

log = logging.getLogger("tickwheel.replication.state")

_LEASE_EVENTS = {LeaseOp.ACK: "acked", LeaseOp.RELEASE: "released", LeaseOp.RETURN: "returned"}
"""The ledger's event of each lease operation that ends a lease (an extension ends none)."""




@dataclass(frozen=True, slots=True)
class StateConfig:
    wheel: WheelConfig = field(default_factory=WheelConfig)
    dedupe_window_ms: int = 600_000
    """How long (in leader stamp time) a scheduled id is remembered."""
    max_dedupe_ids: int = 2_000_000
    """At most this many ids are remembered (about 150 bytes each); the oldest go first."""
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

    def __init__(self, root: Path, config: StateConfig, copies: CopySource | None = None,
                 ledger: LedgerSink | None = None) -> None:
        self._root = root
        self._config = config
        self._copies = copies
        self.mended = MendCounts()
        """What mending did to the wheel's files since the node started (over reopens)."""
        wheel, dedupe = self.open_files(root)
        self._s = Stores(wheel, dedupe, PendingCounts(config.max_tracked_topics),
                         Groups(config.max_ready_msgs, config.max_groups),
                         config.wheel.max_delay_ms, ledger=ledger)
        self._scheduling = Scheduling(self._s)
        self._retiring = Retiring(self._s, config.max_moved_msgs)
        self._last_manifest: Manifest | None = None
        self.shard_map: ShardMapRecord | None = None
        """The newest shard map a command set, if any (else the node's own)."""
        self.cluster_version = BASELINE
        """The formats this cluster writes (`tickwheel.common.versions`): set by ``finalize``
        commands, carried by snapshots."""

    @classmethod
    def open(cls, root: Path, config: StateConfig, *, fresh: bool,
             copies: CopySource | None = None, ledger: LedgerSink | None = None
             ) -> StateMachine:
        """Open the state under ``root``. ``fresh``: no snapshot exists, so the Raft journal
        will replay from its first entry, and whatever files are here must go first.
        ``copies``: other replicas' copies of the state files (paths relative to ``root``), where
        a damaged record, index unit or tombstone of the wheel is mended from. ``ledger``: told
        what each command changed (`tickwheel.replication.ledger`)."""
        if fresh and (root.exists() or root.is_symlink()):
            log.info("event=state_reset root=%s reason=no_snapshot", root)
            remove_state(root)
        root.mkdir(parents=True, exist_ok=True)
        return cls(root, config, copies, ledger)

    @property
    def wheel(self) -> Wheel:
        return self._s.wheel

    @property
    def dedupe(self) -> DedupeWindow:
        return self._s.dedupe

    @property
    def pending(self) -> PendingCounts:
        return self._s.pending

    def due_histogram(self, start_second: int, bucket_s: int, buckets: int,
                      topic: str | None = None) -> DueHistogram:
        """`Wheel.due_histogram` (any thread); with ``topic``, the messages tracked under its
        tag alone: none if it has no tag (no pending message of it is tracked by name)."""
        if topic is None:
            return self.wheel.due_histogram(start_second, bucket_s, buckets)
        pending = self._s.pending
        while (tag := pending.tag_of(topic)) is not None:
            counted = self.wheel.due_histogram(start_second, bucket_s, buckets, tag)
            if pending.tag_of(topic) == tag:  # not freed and given to another meanwhile
                return counted
        return DueHistogram(start_second, bucket_s, (0,) * buckets, 0, 0)

    @property
    def groups(self) -> Groups:
        return self._s.groups

    @property
    def readied(self) -> dict[int, BitMap]:
        """Positions at or past the cursor that left the wheel for their groups (`Stores`)."""
        return self._s.readied

    @property
    def handle_key(self) -> bytes | None:
        return self._s.handle_key

    @property
    def moves(self) -> dict[int, int]:
        """Rescheduled messages' handles -> their copies' (`Stores.moves`)."""
        return self._s.moves

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

    def refused_topic(self, handles: Sequence[int], field: str,
                      may: Callable[[str], bool]) -> Rejected | None:
        """`Rejected` naming ``field.format(i)`` for the first handle whose message is of a
        topic ``may`` refuses (`Retiring.refused_topic`)."""
        return self._retiring.refused_topic(handles, field, may)

    # -- applying commands ----------------------------------------------------------------

    def apply(self, command: bytes) -> object:
        """Apply one command; returns what its proposer gets back (see each ``apply_*``)."""
        kind, stamp_ms = commands.read_header(command)
        if kind is Kind.SCHEDULE or kind is Kind.SCHEDULE_BY:
            return self._scheduling.apply_schedule(command, stamp_ms)
        if kind is Kind.HANDOUT:
            return self._apply_handout(command, stamp_ms)
        if kind is Kind.LEASES:
            return self._apply_leases(command, stamp_ms)
        if kind is Kind.RETRY:
            return self._scheduling.apply_retry(command, stamp_ms)
        if kind is Kind.CANCEL or kind is Kind.CANCEL_BY:
            return self._retiring.apply_cancel(command, stamp_ms)
        if kind is Kind.MOVE or kind is Kind.MOVE_BY:
            return self._retiring.apply_move(command, stamp_ms)
        if kind is Kind.GROUP:
            return self._apply_group(command, stamp_ms)
        if kind is Kind.RESCHEDULE:
            return self._scheduling.apply_reschedule(command, stamp_ms)
        if kind is Kind.BARRIER:
            return self._apply_barrier(command, stamp_ms)
        if kind is Kind.SHARD_MAP:
            return self._apply_shard_map(command, stamp_ms)
        if kind is Kind.FINALIZE:
            return self._apply_finalize(command)
        return self._apply_cursor(commands.read_cursor(command), stamp_ms)

    def _apply_barrier(self, command: bytes, stamp_ms: int) -> Cursor:
        """A new leader took office: its predecessor's stream leases end, and the cluster
        gets its handle key if it has none."""
        position, key = commands.read_barrier(command)
        released = self.groups.release_streams()
        if released:
            log.info("event=stream_leases_released leases=%d", released)
        if key is not None and self._s.handle_key is None:
            self._s.handle_key = key
            log.info("event=handle_key_set")
        return self._apply_cursor(position, stamp_ms)

    def _apply_finalize(self, command: bytes) -> int:
        """Take a newer cluster version; returns the version now in force. A version this
        build does not know stops the node (an older release in a cluster finalized past it):
        it cannot write what the others now read."""
        version = commands.read_finalize(command)
        invariant(version <= CURRENT, f"the cluster was finalized at version "
                  f"{describe(version)}; this build writes at most {describe(CURRENT)}: run "
                  "the release the other members run")
        if version > self.cluster_version:
            self.cluster_version = version
            log.info("event=cluster_version_finalized version=%d", version)
        return self.cluster_version

    def _apply_shard_map(self, command: bytes, stamp_ms: int) -> int:
        """Take a newer shard map (an older or the same version changes nothing); returns
        the version now in force."""
        version, body = commands.read_shard_map(command)
        current = self.shard_map
        if current is None or version > current.version:
            self.shard_map = ShardMapRecord(version, stamp_ms, body)
            log.info("event=shard_map_changed version=%d", version)
            return version
        return current.version

    def _apply_handout(self, command: bytes, stamp_ms: int) -> list[int]:
        """Ready the messages that came due (not one cancelled since the leader took it), then
        grant the leases: per grant its sequence number, or 0 when the message is not ready
        in that group (cancelled, dropped, leased already)."""
        stamp_ms = max(stamp_ms, self.wheel.stamp_ms)
        strings, ready, grants = commands.read_handout(command)
        if ready:
            cancelled = self._s.wheel.handles.cancelled_among([row[0] for row in ready])
            mark_readied = self._s.mark_readied
            # not cancelled meanwhile, nor readied already (a handout proposed twice)
            fresh = [(handle, strings[topic], None if target < 0 else strings[target])
                     for handle, second, local_index, topic, target in ready
                     if handle not in cancelled and mark_readied(second, local_index)]
            self._s.groups.ready_many(fresh, stamp_ms)
        seqs = self._s.groups.grant_many(grants, strings)
        if self._s.ledger is not None and grants:
            granted = [(grant, seq) for grant, seq in zip(grants, seqs, strict=True) if seq]
            self._s.ledger.add(LedgerRows("leased", stamp_ms, {
                "handle": [grant[0] for grant, _ in granted],
                "topic": [strings[grant[1]] for grant, _ in granted],
                "group": [strings[grant[2]] for grant, _ in granted],
                "lease": [seq for _, seq in granted],
                "deadline_ms": [grant[4] for grant, _ in granted],
                "possible_duplicate": [seq > 1 for _, seq in granted]}))
        return seqs

    def _apply_leases(self, command: bytes, stamp_ms: int) -> list[bool]:
        """Acks, releases or new deadlines, each of a genuine current receipt (else False and
        nothing changes)."""
        op, refs = commands.read_leases(command)
        groups = self.groups
        if op is LeaseOp.EXTEND:
            return [groups.extend(ref, deadline_ms) for ref, deadline_ms in refs]
        # named before the acks: a default group that holds nothing more goes away
        names = ({group_id: groups.by_id(group_id) for group_id in {ref[0] for ref, _ in refs}}
                 if self._s.ledger is not None else {})
        if op is LeaseOp.ACK:
            done = groups.resolve_many([ref for ref, _ in refs])
        elif op is LeaseOp.RELEASE:
            done = [groups.release(ref) for ref, _ in refs]
        else:
            done = [groups.give_back(ref) for ref, _ in refs]
        if self._s.ledger is not None and any(done):
            changed = [ref for (ref, _), ok in zip(refs, done, strict=True) if ok]
            found = [names.get(ref.group_id) for ref in changed]
            self._s.ledger.add(LedgerRows(_LEASE_EVENTS[op], stamp_ms, {
                "handle": [ref.handle for ref in changed],
                "topic": [None if group is None else group.topic for group in found],
                "group": [None if group is None else group.name for group in found],
                "lease": [ref.seq for ref in changed]}))
        return done

    def _apply_group(self, command: bytes, stamp_ms: int) -> bool:
        """Create (True if it exists now, or is an implicit default group) or delete (True if
        it existed) a group."""
        create, topic, name = commands.read_group(command)
        if create:
            return self.groups.create(topic, name, max(stamp_ms, self.wheel.stamp_ms))
        return self.groups.delete(topic, name)

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
            self._retiring.forget_moves(self.wheel.cursor)
        return self.wheel.cursor

    def _forget_readied(self, cursor: Cursor) -> None:
        readied = self._s.readied
        for second in [s for s in readied if s < cursor.second]:
            del readied[second]
        at_cursor = readied.get(cursor.second)
        if at_cursor is not None:
            at_cursor.remove_range(0, cursor.local_index)
            if not at_cursor:
                del readied[cursor.second]

    # -- snapshots --------------------------------------------------------------------------

    def manifest(self) -> Manifest:
        """Flush everything and list it (`capture`, with every named byte written)."""
        self.flush()
        return self.capture()

    def capture(self) -> Manifest:
        """What a snapshot names now: the wheel's files at the lengths they have once their
        buffered appends are written (read from memory: `Wheel.lengths`; the caller writes
        them, `tickwheel.replication.taking`), the dedupe window's flushed and listed (a
        ``stat`` a bucket, ten or so), and the rest of the state, copied."""
        files = {f"{WHEEL}/{path}": size
                 for path, size in self.wheel.lengths(self.groups.oldest_hour()).items()}
        files.update({f"{DEDUPE}/{path}": size for path, size in self.dedupe.files().items()})
        return Manifest(self.wheel.cursor, self.wheel.stamp_ms, files, self.pending.snapshot(),
                        self.groups.snapshot(),
                        {second: indexes.copy() for second, indexes in self.readied.items()},
                        self.handle_key, dict(self.moves), self.shard_map,
                        self.cluster_version)

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

    def install(self, manifest: Manifest, fetch: Fetch,
                fetch_many: FetchMany | None = None) -> None:
        """Make the files exactly those of ``manifest``: cut what is longer, delete what it
        does not name, fetch from a peer what is missing; then reopen."""
        started_s = time.monotonic()
        self.close()
        fetched = restore_files(self._root, manifest.files, fetch, fetch_many)
        self.take_over(manifest, self.open_files(self._root), fetched, started_s)

    def take_over(self, manifest: Manifest, files: tuple[Wheel, DedupeWindow],
                  fetched_bytes: int, started_s: float) -> None:
        """Go on from ``manifest`` with ``files`` (`open_files` of the folder that holds
        exactly what it names: `install`, or a generation gathered beforehand,
        `tickwheel.replication.staging`), the files before closed."""
        self.close()
        self._s.wheel, self._s.dedupe = files
        self._s.wheel.reset_to(manifest.cursor, manifest.stamp_ms)
        self._s.pending.restore(manifest.pending)
        self._s.groups.restore(manifest.groups)
        self._s.readied = {second: indexes.copy() for second, indexes in manifest.readied.items()}
        self._s.handle_key = manifest.handle_key
        self._s.moves = dict(manifest.moves)
        self.shard_map = manifest.shard_map
        self.cluster_version = manifest.cluster_version
        self._last_manifest = manifest
        log.info("event=snapshot_installed files=%d fetched_bytes=%d cursor_second=%d "
                 "cursor_local_index=%d duration_ms=%.1f", len(manifest.files), fetched_bytes,
                 *manifest.cursor, (time.monotonic() - started_s) * 1000)

    def flush(self) -> None:
        """Write what the wheel and the dedupe window buffer to their files."""
        self.wheel.flush()
        self.dedupe.flush()

    def close(self) -> None:
        self.wheel.close()
        self.dedupe.close()

    def open_files(self, root: Path) -> tuple[Wheel, DedupeWindow]:
        """The wheel and the dedupe window on the files under ``root`` (any thread: a
        generation a snapshot install gathers is opened before it is switched to)."""
        wheel_copies = None if self._copies is None else partial(copies_under, self._copies,
                                                                 WHEEL)
        return (Wheel.open(root / WHEEL, self._config.wheel,
                           copies=wheel_copies, mend_counts=self.mended),
                DedupeWindow.open(root / DEDUPE, self._config.dedupe_window_ms,
                                  self._config.max_dedupe_ids))
