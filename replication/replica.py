"""A replica: the wheel on Raft, with the thread that drives it.

One thread (``tickwheel-raft``) owns everything stateful. Each turn of its loop:

1. `RaftPort.tick`: Raft sends and receives, commits, applies committed commands to the
   `StateMachine`, takes snapshots and installs them (`tickwheel.replication.snapshots`);
2. notices leadership changes (`tickwheel.replication.leadership`): a new leader proposes a
   barrier and starts dispatch once it is applied; a node that stops leading ends it at once;
3. on the leader, makes commands of the requests other threads queued
   (`tickwheel.replication.requests`): schedules and retries packed into entries (group
   commit), cancels, group changes, and acks, releases and deadline changes of leases;
4. on the leader holding its tenure, dispatches: one *handout* of the messages coming due and
   the leases granted on them, expired leases to be retried, the cursor now and then;
5. sleeps in the poller until a socket, a request, an ack, or the next due time.

Other threads talk to it only through thread-safe queues (`schedule`, `retry`, `cancel`,
`join`, `credit`, `ack` ...) and a pipe that wakes the poller; they read `status`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from tickwheel.common.clock import Clock, SystemClock
from tickwheel.common.errors import NotLeader, Retryable, TickwheelError
from tickwheel.common.exits import EXIT_DISK_FULL, EXIT_FATAL
from tickwheel.replication import commands
from tickwheel.replication.cluster_clock import ClusterClock
from tickwheel.replication.commands import LeaseOp, LeaseRef
from tickwheel.replication.config import ReplicaConfig
from tickwheel.replication.dispatcher import DeliverySink
from tickwheel.replication.exits import Die, apply_exit_code, apply_failed, die
from tickwheel.replication.groups import Groups
from tickwheel.replication.handle_cipher import HandleCipher
from tickwheel.replication.handout import ConsumerSlot
from tickwheel.replication.leadership import Leadership
from tickwheel.replication.ledger import LedgerSink
from tickwheel.replication.proposals import Applied, Proposals
from tickwheel.replication.raft import DISK_FULL, RaftNode, RaftPort
from tickwheel.replication.requests import Requests
from tickwheel.replication.snapshots import (
    PeerCopies,
    PeerFetch,
    PeerFetchMany,
    PeerFiles,
    Snapshots,
    starts_fresh,
)
from tickwheel.replication.state import StateMachine
from tickwheel.replication.state_files import ShardMapRecord
from tickwheel.replication.status import ReplicaStatus
from tickwheel.replication.upgrade import Upgrade
from tickwheel.wheel import DueHistogram, NewMessage

log = logging.getLogger("tickwheel.replication")

RaftFactory = Callable[..., RaftPort]
"""``factory(address, peers, raft_dir, config, apply, (serialize, deserialize), wall_ms=,
prefetch=, taking=)``: `RaftNode`, or a stand-in that drives the replica without sockets."""
WALK_AHEAD_UNITS = 4_000
"""Index units of the next second the cursor will pass read per Raft thread turn, ahead of
the cursor command that needs them (~2 ms): a second of 20,000 messages is read in 5 turns
instead of in one 12 ms stall."""


class Replica:
    """One member of a tickwheel cluster. `start` it, use it, `stop` it."""

    def __init__(self, address: str, peers: Sequence[str], data_dir: Path | str,
                 sink: DeliverySink, *, fetch: PeerFetch, copies: PeerCopies | None = None,
                 fetch_many: PeerFetchMany | None = None, clock: Clock | None = None,
                 config: ReplicaConfig | None = None, raft: RaftFactory = RaftNode,
                 die: Die = die, ledger: LedgerSink | None = None) -> None:
        self.address = address
        self._die = die
        self._peers = tuple(peers)
        self._data_dir = Path(data_dir)
        local = clock or SystemClock()
        self._config = config or ReplicaConfig()
        fresh = starts_fresh(self._data_dir)
        peer_files = PeerFiles(peers, fetch, self.leader_hint,
                               lambda: self._leadership.term is not None, fetch_many)
        self._state = StateMachine.open(self._data_dir / "state", self._config.state,
                                        fresh=fresh, copies=None if copies is None else partial(
                                            peer_files.copies, copies), ledger=ledger)
        self._snapshots = Snapshots(address, self._data_dir, self._state, peer_files,
                                    self._config.raft, local, die)
        self._raft = raft(address, list(peers), self._data_dir / "raft", self._config.raft,
                          self._apply, (self._snapshots.take, self._deserialize),
                          wall_ms=local.now_ms, prefetch=self._snapshots,
                          taking=self._snapshots.takes)
        self._snapshots.takes.wake = self._raft.wake
        self.clock = self._clock = ClusterClock(address, local, self._raft,
                                                len(self._peers) + 1,
                                                self._config.raft.election_min_ms)
        """What every time this node stamps, dispatches and sends by is read from (any
        thread): the cluster's time while it leads (`tickwheel.replication.cluster_clock`)."""
        self._requests = Requests(self._config.raft.max_entry_bytes,
                                  self._config.max_queued_msgs, self._raft.wake,
                                  self._wake_for_schedules)
        self._proposals = Proposals(self._raft, self.leader_hint)
        self._leadership = Leadership(self._config, self._raft, self._state, self._clock, sink,
                                      self._proposals, self._requests, self.leader_hint)
        self.upgrade = Upgrade(self._raft, self._peers, self._state, self._requests)
        self._cipher: tuple[bytes, HandleCipher] | None = None
        self._bytes_since_snapshot = 0
        self._changed = True
        """Something was applied or installed since the last step."""
        self._quiet_until_s = 0.0
        """Until when the last step's answer holds if nothing changes (0: no longer than
        this turn)."""
        self._next_turn_s = 0.0
        """When the Raft thread's next turn starts at the latest (its poller's timeout)."""
        self._ride_s = 0.0
        """How far off that turn may be for a schedule request to wait for it: the linger, or the
        slow rate's step span (`DispatchConfig.slow_lead_ms`) if it is a dispatch step."""
        self._linger_s = self._config.schedule_linger_ms / 1000
        dispatch = self._config.dispatch
        # a step's time is whole milliseconds: up to one more than the span
        self._step_ride_s = (max(self._linger_s,
                                 (dispatch.slow_lead_ms - dispatch.min_lead_ms + 1) / 1000)
                             if self._linger_s else 0.0)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tickwheel-raft", daemon=True)

    # -- the public surface (any thread) --------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, close Raft, flush the wheel."""
        self._stopping.set()
        self._raft.wake()
        if self._thread.ident is not None:  # a simulation turns it without the thread
            self._thread.join()
        self._raft.close()
        self._state.close()
        log.info("event=replica_stopped address=%s", self.address)

    def schedule(self, messages: Sequence[NewMessage], map_version: int = 0,
                 principal: str = "") -> Applied:
        """Queue ``messages`` (``principal``'s) for the next entry; the future gets one
        `Accepted` or `Rejected` per message, in order, or fails with `MapChanged` if a shard
        map newer than ``map_version`` (theirs) was proposed first. `NotLeader`, `Overloaded`."""
        self._require_leader()
        self._state.wheel.check_delays([m.deliver_at_ms for m in messages], self._clock.now_ms())
        return self._requests.schedules.submit([commands.encoded_message(m) for m in messages],
                                               map_version, principal)

    def change_shard_map(self, version: int, body: bytes) -> Applied:
        """Propose shard map ``version`` (``body``); the future gets the one in force then."""
        self._require_leader()
        return self._requests.map_op(version, body)

    @property
    def dedupe_window_ms(self) -> int:
        """How long a scheduled id is remembered (`StateConfig.dedupe_window_ms`)."""
        return self._config.state.dedupe_window_ms

    @property
    def shard_map(self) -> ShardMapRecord | None:
        """The newest shard map a command set (any thread: one reference, read once)."""
        return self._state.shard_map

    def remembered(self, ids: Sequence[str]) -> dict[int, tuple[int, int]]:
        """Which of ``ids`` this shard remembers scheduling (by index): ``(handle, due_ms)``.
        Any thread: it reads the dedupe window one key at a time (a key stays till its bucket)."""
        keys = [commands.dedupe_key(message_id) for message_id in ids]
        found = self._state.dedupe.remembered_any(keys)
        return {index: found[key] for index, key in enumerate(keys) if key in found}

    def due_histogram(self, start_second: int, bucket_s: int, buckets: int,
                      topic: str | None = None) -> DueHistogram:  # any thread: reads counts
        return self._state.due_histogram(start_second, bucket_s, buckets, topic)

    def retry(self, retries: Sequence[tuple[LeaseRef, NewMessage]]) -> Applied:
        """For each ``(lease, copy)``: resolve the leased message and file ``copy`` (same id,
        new due time and attempt, maybe another topic) in one replicated command. The future
        gets one `Retried` or `Rejected` per item, in order; ``Retried(None, ...)`` when the
        lease was no longer current (acked, retried, released). Raises `NotLeader` on a
        follower, `Overloaded` when full."""
        self._require_leader()
        return self._requests.retries.submit([commands.encoded_leased_retry(lease, copy)
                                     for lease, copy in retries])

    def cancel(self, handles: Sequence[int], may: Callable[[str], bool] | None = None,
               principal: str = "") -> Applied:
        """A `CancelResult` per handle (cancelled for ``principal``), or, cancelling none, one
        `Rejected` naming ``handles[i]``: never issued, or of a topic ``may`` refuses."""
        handles = list(handles)
        return self._handle_op(lambda stamp_ms, by: commands.cancel(
            stamp_ms, handles, principal if by else None), handles, "handles[{}]", may)

    def reschedule(self, moves: Sequence[tuple[int, int]],
                   may: Callable[[str], bool] | None = None, principal: str = "") -> Applied:
        """Move pending messages: ``(handle, deliver_at_ms)`` each, for ``principal``. The
        future gets a `Moved` per move, or one `Rejected` (naming ``moves[i]``; also when
        ``may`` refuses a message's topic): then nothing moved."""
        moves = list(moves)
        return self._handle_op(lambda stamp_ms, by: commands.move(stamp_ms, moves, principal if by
                               else None), [h for h, _ in moves], "moves[{}].handle", may)

    def _handle_op(self, command: Callable[[int, bool], bytes], handles: list[int], field: str,
                   may: Callable[[str], bool] | None) -> Applied:
        """Queue a cancel or a reschedule, made into its command (given the stamp) when the Raft
        thread proposes it. With ``may``, the Raft thread first reads the topic of each handle's
        message (a handle does not carry it; a message never changes topic, so the answer holds when
        the command applies) and refuses the whole request if ``may`` refuses one."""
        self._require_leader()
        return self._requests.handle_op(command, None if may is None else (
            lambda: self._state.refused_topic(handles, field, may)))

    def ack(self, leases: Sequence[LeaseRef], wake: bool = True) -> Applied:
        """Acknowledge leased messages: the future gets, per lease, whether it was a genuine
        current lease (then the message is done in its group; else nothing changed). Without
        ``wake`` the acks go with the next turn's commands (the next dispatch step while
        messages come due; at most ``cursor_sync_ms`` later when none do): for a caller
        that does not wait for the answer, an ack is then not a Raft round of its own."""
        return self._lease_op(LeaseOp.ACK, leases, wake=wake)

    def release(self, leases: Sequence[LeaseRef]) -> Applied:
        """End leases early: their messages are ready again for their groups."""
        return self._lease_op(LeaseOp.RELEASE, leases)

    def give_back(self, leases: Sequence[LeaseRef]) -> Applied:
        """End leases whose messages were never sent: ready again, and their next delivery
        is not flagged for them."""
        return self._lease_op(LeaseOp.RETURN, leases)

    def extend(self, leases: Sequence[LeaseRef], deadlines_ms: Sequence[int]) -> Applied:
        """Move the deadlines of current leases (shorter or longer)."""
        return self._lease_op(LeaseOp.EXTEND, leases, deadlines_ms)

    def ensure_group(self, topic: str, name: str) -> Applied:
        """Create the consumer group ``(topic, name)`` unless it exists; the future gets
        whether it exists now (False: ``max_groups`` reached)."""
        return self._group_op(True, topic, name)

    def delete_group(self, topic: str, name: str) -> Applied:
        """Delete a consumer group and all that waits in it; the future gets if it existed."""
        return self._group_op(False, topic, name)

    def join(self, slot: ConsumerSlot) -> None:
        """A consumer of ``slot.group`` with credits (any thread; on the leader)."""
        self._requests.consumer_op(lambda planner: planner.join(slot))

    def credit(self, key: int, credits: int) -> None:
        """More credits for consumer ``key``. The Raft thread is woken for them only while
        ready messages wait for credits; otherwise the next dispatch step reads them first,
        which is soon enough (`Planner.waiting`)."""
        self._requests.consumer_op(lambda planner: planner.credit(key, credits), wake=False)
        planner = self._leadership.planner  # read after the queueing: see Leadership._sleep_s
        if planner is None or planner.waiting:
            self._raft.wake()

    def sent(self, key: int, leases: Sequence[LeaseRef], sent_ms: int) -> None:
        """The courier sent these leases' messages at ``sent_ms``: their visibility timeout
        counts from then (not from the grant, a commit round earlier). Read at the next turn:
        nothing waits for it."""
        self._requests.consumer_op(lambda planner: planner.sent(key, leases, sent_ms),
                                   wake=False)

    def leave(self, key: int) -> None:
        """The consumer's stream closed: its stream leases are released (given back, for
        those whose messages were never sent)."""
        self._requests.leave(key)

    def handle_cipher(self) -> HandleCipher:
        """What turns wheel handles into the ones clients see and back (any thread); raises
        `Retryable` before the cluster's first leader set the handle key."""
        key = self._state.handle_key
        if key is None:
            raise Retryable("the cluster has no handle key yet (no leader yet); retry")
        cipher = self._cipher
        if cipher is None or cipher[0] != key:
            cipher = self._cipher = (key, HandleCipher(key, self._config.shard))
        return cipher[1]

    @property
    def shard(self) -> int:
        """The shard this replica's group is (0 in a cluster of one shard)."""
        return self._config.shard

    def groups(self) -> Groups:
        """The replicated consumer groups (read `Groups.summary` from other threads)."""
        return self._state.groups

    def _lease_op(self, op: LeaseOp, leases: Sequence[LeaseRef],
                  deadlines_ms: Sequence[int] = (), wake: bool = True) -> Applied:
        self._require_leader()
        return self._requests.lease_op(op, leases, deadlines_ms, wake)

    def _group_op(self, create: bool, topic: str, name: str) -> Applied:
        self._require_leader()
        return self._requests.group_op(create, topic, name)

    def may_deliver(self) -> bool:
        """Whether this node still holds its tenure (any thread). A sink that hands messages
        out later than `DeliverySink.deliver` checks it first: after a pause, its tenure has
        run out before the Raft thread has noticed that another node leads."""
        return self._leadership.may_deliver()

    def read_state_file(self, path: str, offset: int, size: int) -> bytes:
        """Bytes of a state file, for a peer installing a snapshot (any thread)."""
        return self._snapshots.read_state_file(path, offset, size)

    def status(self) -> ReplicaStatus:
        raft = self._raft.status()
        groups = self._state.groups.summary()
        dispatching = self._leadership.dispatcher.active
        return ReplicaStatus(
            address=self.address, role=raft.role.name.lower(), leader=raft.leader,
            term=raft.term, commit_index=raft.commit_index,
            last_applied=raft.last_applied, cursor=self._state.cursor,
            stamp_ms=self._state.stamp_ms, dispatching=dispatching,
            inflight_msgs=sum(group.leased for group in groups), peers=self._peers,
            connected=raft.connected, match_index=raft.match_index,
            leader_commit_index=raft.leader_commit_index,
            readied_past_cursor=self._state.readied_past_cursor,
            groups=groups,
            pending=self._state.pending.by_topic(),
            pending_untracked=self._state.pending.untracked,
            mended=replace(self._state.mended),
            damage_held=self._state.wheel.damage_held if dispatching else None,
            raft_steps=raft.steps)

    # -- the loop (the Raft thread) -------------------------------------------------------

    def _run(self) -> None:
        wait_s = 0.0
        try:
            self._snapshots.install_own()
            while not self._stopping.is_set():
                wait_s = self.turn(wait_s)
        except TickwheelError as error:
            self._die(self.address, f"{type(error).__name__}: {error}", EXIT_FATAL)
        except OSError as error:
            if error.errno not in DISK_FULL:
                log.exception("event=raft_thread_crashed")
                self._die(self.address, repr(error), EXIT_FATAL)
            log.critical("event=disk_full address=%s path=%s the disk is full: this node stops "
                         "rather than skip a write; free space (or grow the volume) and it "
                         "restarts from its snapshot and journal", self.address,
                         error.filename or self._data_dir)
            self._die(self.address, f"disk full: {error}", EXIT_DISK_FULL)
        except Exception as error:
            log.exception("event=raft_thread_crashed")
            self._die(self.address, repr(error), EXIT_FATAL)

    def turn(self, wait_s: float) -> float:
        """One turn of the loop (the Raft thread's, or a simulation's that never starts the
        thread): Raft's tick, waiting at most ``wait_s``, then the replica's step. Returns how
        long the next tick may wait.

        A tick that applied nothing, installed nothing and changed no leadership, with
        nothing queued by other threads and before the time the last step asked to be woken
        at, leaves the step nothing to do: it is skipped (a leader's turn for the second
        follower's answer to an AppendEntries, a heartbeat's answers)."""
        self._raft.tick(wait_s)
        now_s = self._clock.monotonic_s()
        if now_s < self._quiet_until_s and self._quiet():
            self._leadership.renew_tenure()
            self._next_turn_s = self._quiet_until_s
            return self._quiet_until_s - now_s
        self._changed = False
        wait_s = self._step()
        self._state.wheel.walk_ahead(WALK_AHEAD_UNITS, self._clock.local.now_ms())
        settled = self._leadership.term is None or self._leadership.settled
        self._quiet_until_s = now_s + wait_s if settled else 0.0
        # Set before the queue is read: a request queued after the read sees this turn's
        # time, and wakes the thread if it is too far off.
        self._next_turn_s = now_s + wait_s
        self._ride_s = self._step_ride_s if self._leadership.steps_next else self._linger_s
        if self._requests.schedules.queued_msgs:  # came during the step, and did not wake it
            wait_s = min(wait_s, self._ride_s)
            self._next_turn_s = now_s + wait_s
        return wait_s

    def _wake_for_schedules(self) -> None:
        """Wake the Raft thread for a schedule request unless its next turn comes within
        ``schedule_linger_ms`` anyway, or is a dispatch step (at a slow rate up to 20 ms off):
        that turn proposes the request with whatever else it carries (a dispatch step's
        handout, acks, other requests), one Raft round for all."""
        if self._next_turn_s - self._clock.monotonic_s() > self._ride_s:
            self._raft.wake()

    def _quiet(self) -> bool:
        """Whether the step would find everything as it left it (but the time)."""
        leading = self._raft.is_leader()
        return (not self._changed and self._requests.idle
                and leading == (self._leadership.term is not None)
                and (not leading or self._raft.term() == self._leadership.term))

    def _step(self) -> float:
        """One turn after Raft's tick; returns how long the poller may sleep."""
        now_ms = self._clock.now_ms()
        self._leadership.follow()
        if self._leadership.term is None:
            self._requests.refuse_writes(NotLeader(self.leader_hint()))
            return self._config.idle_tick_ms / 1000
        self._requests.propose(now_ms, self._proposals, self._leadership.planner, self._state)
        return self._leadership.step(now_ms)

    # -- the state machine's side of Raft (also on the Raft thread) ------------------------

    def _apply(self, command: bytes) -> object:
        self._changed = True
        self._bytes_since_snapshot += len(command)
        if self._bytes_since_snapshot >= self._config.raft.snapshot_min_bytes:
            self._bytes_since_snapshot = 0  # counted from the snapshot asked for
            self._raft.compact()
        try:
            return self._state.apply(command)
        except Exception as error:
            code = apply_exit_code(error)
            if code is None:
                raise  # a full disk: the loop's own word on it
            apply_failed(self._die, self.address, self._raft.status().last_applied + 1,
                         command, error, code)

    def _deserialize(self, path: str) -> tuple[Any, ...]:
        self._changed = True
        raft_tail, took_s = self._snapshots.install(path)
        if took_s > self._config.raft.election_min_ms / 2000:
            self._raft.postpone_election()
        if self._leadership.term is not None:
            self._leadership.end()
        return raft_tail

    # -- helpers ----------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if not self.is_leader():
            raise NotLeader(self.leader_hint())

    def is_leader(self) -> bool:
        """Whether this node is the Raft leader now (any thread)."""
        return self._raft.is_leader()

    def leader_hint(self) -> str | None:
        """The leader's Raft address, if known (any thread)."""
        return self._raft.leader()
