"""A replica: the wheel on Raft, with the thread that drives it.

One thread (``tickwheel-raft``) owns everything stateful. Each turn of its loop:

1. `RaftPort.tick`: Raft sends and receives, commits, applies committed commands to the
   `StateMachine`, takes snapshots and installs them;
2. notices leadership changes. A new leader proposes a *barrier* (a cursor command that moves
   nothing); once it is applied, every entry of earlier terms is applied too, and dispatch
   starts from the replicated cursor. A node that stops leading ends dispatch at once;
3. on the leader, packs queued schedule and retry requests into entries (group commit) and
   proposes them, with cancels, group changes, and acks, releases and deadline changes of
   leases (one command per kind per turn);
4. on the leader holding its lease, takes due messages from the wheel and proposes one
   *handout*: those messages readied for their consumer groups, and leases granted to
   consumers with credits (`tickwheel.replication.handout`); once it is applied, hands the
   granted messages to the sink. Leases whose deadline passed go to the sink to be retried.
   Every ``cursor_sync_ms`` it proposes the cursor if it moved;
5. sleeps in the poller until a socket, a request, an ack, or the next due time.

Other threads talk to it only through thread-safe queues (`schedule`, `retry`, `cancel`,
`join`, `credit`, `ack` ...) and a pipe that wakes the poller, and read `status`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from tenacity import (
    RetryCallState,
    retry,
    retry_if_result,
    stop_after_delay,
    wait_random_exponential,
)

from tickwheel.common.clock import Clock, SystemClock
from tickwheel.common.errors import (
    CorruptSegment,
    InvariantViolation,
    NotLeader,
    Overloaded,
    Retryable,
    StorageIncomplete,
    TickwheelError,
    UnknownHandle,
)
from tickwheel.replication import commands
from tickwheel.replication.commands import HANDLE_KEY_BYTES, LeaseOp, LeaseRef
from tickwheel.replication.dispatcher import DeliverySink, DispatchConfig, Dispatcher
from tickwheel.replication.group_commit import Entry, GroupCommitter, resolve
from tickwheel.replication.groups import Groups, GroupSummary
from tickwheel.replication.handles import HandleCipher
from tickwheel.replication.handout import ConsumerSlot, Planner
from tickwheel.replication.raft import (
    DISK_FULL,
    JOURNAL_FILE,
    SNAPSHOT_FILE,
    RaftConfig,
    RaftNode,
    RaftPort,
    SnapshotDamaged,
    SyncLedger,
    fsync_files,
    journal_first_index,
    read_snapshot,
    write_snapshot,
)
from tickwheel.replication.state import Manifest, Rejected, Retried, StateConfig, StateMachine
from tickwheel.wheel import Cursor, DueMessage, NewMessage
from tickwheel.wheel.mending import MendCounts

log = logging.getLogger("tickwheel.replication")

RaftFactory = Callable[..., RaftPort]
"""``factory(address, peers, raft_dir, config, apply, (serialize, deserialize))``: `RaftNode`,
or a stand-in that drives the replica without sockets."""
PeerFetch = Callable[[list[str], str, int, int], bytes]
"""``fetch(peers, path, offset, size)``: bytes of a state file from the first of ``peers`` (Raft
addresses, leader first) that has them. The node provides it (over gRPC)."""
PeerCopies = Callable[[list[str], str, int, int], Iterator[bytes | None]]
"""``copies(peers, path, offset, size)``: what each of ``peers`` in turn holds of a state file
there, asked once (None for a peer that cannot answer now): where damaged bytes of this node's
wheel are mended from (`tickwheel.wheel.mending`)."""
DAMAGE_RETRY_S = 1.0
"""How long the dispatch waits before asking again for a copy of damaged bytes it holds at."""
MEND_PATIENCE_S = 30.0
"""How long a node that does not lead keeps asking for a copy of damaged bytes while no peer
can answer (they may be starting too) before it gives up and stops (exit 70)."""

_FATAL_EXIT_CODE = 70
STORAGE_EXIT_CODE = 3
"""A node that will not serve its data folder (`StorageIncomplete`, a damaged snapshot): an
operator must restore the file or move the folder away."""
DISK_FULL_EXIT_CODE = 74
"""A write found the disk full despite the reserve (`tickwheel.node.disk`): something else
filled it. The state cannot skip an entry, so the node stops, saying so, and a restart (once
there is space) rebuilds it from the snapshot and the journal."""


def _last_result(state: RetryCallState) -> list[bytes | None]:
    if state.outcome is None:
        raise InvariantViolation("tenacity gave up before any attempt")
    answers: list[bytes | None] = state.outcome.result()
    return answers


@retry(retry=retry_if_result(lambda answers: bool(answers) and all(a is None for a in answers)),
       wait=wait_random_exponential(multiplier=0.1, max=2.0),
       stop=stop_after_delay(MEND_PATIENCE_S), retry_error_callback=_last_result)
def _patiently(ask: Callable[[], list[bytes | None]]) -> list[bytes | None]:
    """``ask()`` again while it asks someone and nobody answers (the last answers once out of
    patience)."""
    return ask()

WALK_AHEAD_UNITS = 4_000
"""Index units of the next second the cursor will pass read per Raft thread turn, ahead of
the cursor command that needs them (~2 ms): a second of 20,000 messages is read in 5 turns
instead of in one 12 ms stall."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    raft: RaftConfig = field(default_factory=RaftConfig)
    state: StateConfig = field(default_factory=StateConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    cursor_sync_ms: int = 50
    """The leader proposes the cursor this often, when it moved."""
    max_queued_msgs: int = 200_000
    """Schedule requests waiting for an entry; beyond it `schedule` raises `Overloaded`."""
    idle_tick_ms: int = 50
    dispatch_interval_ms: int = 4
    """After a dispatch step that handed messages over, the next waits this long unless a full
    step (``max_take_msgs``) was taken: a step costs about the same whether it carries one
    message or fifty (the Raft loop, the hand-over to the event loop, a journal write, a gRPC
    write per consumer), and with 1 ms steps those costs outweighed the messages. The first
    message after a quiet spell still goes out at its due time."""


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    address: str
    role: str
    leader: str | None
    term: int
    commit_index: int
    last_applied: int
    cursor: Cursor
    stamp_ms: int
    dispatching: bool
    inflight_msgs: int
    peers: tuple[str, ...]
    connected: tuple[str, ...]
    """Peers this node has a connection to."""
    match_index: dict[str, int]
    """On the leader: the last entry each follower is known to hold."""
    leader_commit_index: int
    """The leader's commit index as this node last heard it."""
    readied_past_cursor: int
    """Messages at or past the cursor already readied for their groups (replicated)."""
    groups: list[GroupSummary]
    """Every consumer group (replicated)."""
    pending: dict[str, int]
    """Messages scheduled and not yet done, per tracked topic (replicated: any node)."""
    pending_untracked: int
    """Pending messages of topics beyond ``max_tracked_topics``."""
    mended: MendCounts
    """Damaged stored units and records this node mended from its peers' copies."""
    damage_held: str | None
    """On the leader: the damage the dispatch waits at until a peer can give a good copy."""


class Replica:
    """One member of a tickwheel cluster. `start` it, use it, `stop` it."""

    def __init__(self, address: str, peers: Sequence[str], data_dir: Path | str,
                 sink: DeliverySink, *, fetch: PeerFetch, copies: PeerCopies | None = None,
                 clock: Clock | None = None,
                 config: ReplicaConfig | None = None, raft: RaftFactory = RaftNode) -> None:
        self.address = address
        self._peers = tuple(peers)
        self._data_dir = Path(data_dir)
        self._sink = sink
        self._fetch = fetch
        self._clock = clock or SystemClock()
        self._config = config or ReplicaConfig()
        self._sync_ledger = (None if self._config.raft.sync_ledger is None
                             else SyncLedger(self._config.raft.sync_ledger))
        self._synced: dict[str, int] = {}
        """With ``fsync``: each state file's length as of its last fsync (`_sync_state_files`)."""
        raft_dir = self._data_dir / "raft"
        fresh = not (raft_dir / SNAPSHOT_FILE).exists()
        first_entry = journal_first_index(raft_dir / JOURNAL_FILE)
        if fresh and first_entry is not None and first_entry > 1:
            raise StorageIncomplete(
                f"{raft_dir / 'snapshot'} is missing, but the Raft journal starts at entry "
                f"{first_entry}: entries 1 to {first_entry - 1} were only in that snapshot, and "
                "without them this node would serve, vote and lead on a partial state. Restore "
                f"the snapshot, or move {self._data_dir} away: the node then starts empty and "
                "catches up from the leader (do that only while a majority of the other members "
                "has its data)")
        self._state = StateMachine.open(self._data_dir / "state", self._config.state, fresh=fresh,
                                      copies=None if copies is None else partial(
                                          self._copies_from_peers, copies))
        self._raft = raft(address, list(peers), raft_dir, self._config.raft,
                          self._apply, (self._serialize, self._deserialize))
        self._committer = GroupCommitter(self._config.raft.max_entry_bytes,
                                         self._config.max_queued_msgs, self._raft.wake)
        self._retries = GroupCommitter(self._config.raft.max_entry_bytes,
                                       self._config.max_queued_msgs, self._raft.wake)
        self._dispatcher = Dispatcher(self._config.dispatch)
        self._planner: Planner | None = None
        self._cancels: deque[tuple[Callable[[int], bytes], Future,
                                   Callable[[], Rejected | None] | None]] = deque()
        """Cancels and reschedules: each a command to make (given the stamp), in order."""
        self._lease_ops: dict[LeaseOp, deque[tuple[list[LeaseRef], list[int], Future]]] = {
            op: deque() for op in LeaseOp}
        self._cipher: tuple[bytes, HandleCipher] | None = None
        self._consumer_ops: deque[Callable[[Planner], None]] = deque()
        """What the courier reported of its consumers, for the planner (on the Raft thread)."""
        self._group_ops: deque[tuple[bool, str, str, Future]] = deque()
        self._lease_until_s = 0.0
        self._inflight_entries: dict[int, Entry | Future] = {}
        self._next_entry_id = 0
        self._leading_term: int | None = None
        self._proposed_cursor: Cursor | None = None
        self._last_cursor_sync = 0.0
        self._next_dispatch_s = 0.0
        self._bytes_since_snapshot = 0
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

    def schedule(self, messages: Sequence[NewMessage]) -> Future:
        """Queue ``messages`` for the next entry; the future gets one `Accepted` or `Rejected`
        per message, in order. Raises `NotLeader` on a follower, `Overloaded` when full."""
        self._require_leader()
        self._state.wheel.check_delays([m.deliver_at_ms for m in messages], self._clock.now_ms())
        return self._committer.submit([commands.encoded_message(m) for m in messages])

    def retry(self, retries: Sequence[tuple[LeaseRef, NewMessage]]) -> Future:
        """For each ``(lease, copy)``: resolve the leased message and file ``copy`` (same id,
        new due time and attempt, maybe another topic) in one replicated command. The future
        gets one `Retried` or `Rejected` per item, in order; ``Retried(None, ...)`` when the
        lease was no longer current (acked, retried, released). Raises `NotLeader` on a
        follower, `Overloaded` when full."""
        self._require_leader()
        return self._retries.submit([commands.encoded_leased_retry(lease, copy)
                                     for lease, copy in retries])

    def cancel(self, handles: Sequence[int],
               may: Callable[[str], bool] | None = None) -> Future:
        """The future gets a `CancelResult` per handle, or one `Rejected` (naming
        ``handles[i]``) when a handle was never issued, or names a message of a topic ``may``
        refuses: then nothing was cancelled."""
        handles = list(handles)
        return self._handle_op(lambda stamp_ms: commands.cancel(stamp_ms, handles),
                               handles, "handles[{}]", may)

    def reschedule(self, moves: Sequence[tuple[int, int]],
                   may: Callable[[str], bool] | None = None) -> Future:
        """Move pending messages: ``(handle, deliver_at_ms)`` each. The future gets a `Moved`
        per move, or one `Rejected` (naming ``moves[i]``; also when ``may`` refuses a
        message's topic): then nothing moved."""
        moves = list(moves)
        return self._handle_op(lambda stamp_ms: commands.move(stamp_ms, moves),
                               [handle for handle, _ in moves], "moves[{}].handle", may)

    def _handle_op(self, command: Callable[[int], bytes], handles: list[int], field: str,
                   may: Callable[[str], bool] | None) -> Future:
        """Queue a cancel or a reschedule, made into its command (given the stamp) when the
        Raft thread proposes it. With ``may``, the Raft thread first reads the topic of each
        handle's message (a handle does not carry it; a message never changes topic, so
        the answer holds when the command applies) and refuses the whole request if ``may``
        refuses one."""
        self._require_leader()
        future: Future = Future()
        if len(self._cancels) >= self._config.max_queued_msgs:
            raise Overloaded("max_queued_msgs")
        check = None if may is None else (
            lambda: self._state.refused_topic(handles, field, may))
        self._cancels.append((command, future, check))
        self._raft.wake()
        return future

    def ack(self, leases: Sequence[LeaseRef]) -> Future:
        """Acknowledge leased messages: the future gets, per lease, whether it was a genuine
        current lease (then the message is done in its group; else nothing changed)."""
        return self._lease_op(LeaseOp.ACK, leases)

    def release(self, leases: Sequence[LeaseRef]) -> Future:
        """End leases early: their messages are ready again for their groups."""
        return self._lease_op(LeaseOp.RELEASE, leases)

    def give_back(self, leases: Sequence[LeaseRef]) -> Future:
        """End leases whose messages were never sent: ready again, and their next delivery
        is not flagged for them."""
        return self._lease_op(LeaseOp.RETURN, leases)

    def extend(self, leases: Sequence[LeaseRef], deadlines_ms: Sequence[int]) -> Future:
        """Move the deadlines of current leases (shorter or longer)."""
        return self._lease_op(LeaseOp.EXTEND, leases, deadlines_ms)

    def ensure_group(self, topic: str, name: str) -> Future:
        """Create the consumer group ``(topic, name)`` unless it exists; the future gets
        whether it exists now (False: ``max_groups`` reached)."""
        return self._group_op(True, topic, name)

    def delete_group(self, topic: str, name: str) -> Future:
        """Delete a consumer group and everything waiting in it; the future gets whether it
        existed."""
        return self._group_op(False, topic, name)

    def join(self, slot: ConsumerSlot) -> None:
        """A consumer of ``slot.group`` with credits (any thread; on the leader)."""
        self._consumer_op(lambda planner: planner.join(slot))

    def credit(self, key: int, credits: int) -> None:
        self._consumer_op(lambda planner: planner.credit(key, credits))

    def sent(self, key: int, leases: Sequence[LeaseRef], sent_ms: int) -> None:
        """The courier sent these leases' messages at ``sent_ms``: their visibility timeout
        counts from then (not from the grant, a commit round earlier)."""
        self._consumer_op(lambda planner: planner.sent(key, leases, sent_ms))

    def leave(self, key: int) -> None:
        """The consumer's stream closed: its stream leases are released (given back, for
        those whose messages were never sent)."""
        def leave(planner: Planner) -> None:
            sent, unsent = planner.leave(key)
            for op, leases in ((LeaseOp.RELEASE, sent), (LeaseOp.RETURN, unsent)):
                if leases:
                    self._lease_ops[op].append((leases, [], Future()))
        self._consumer_op(leave)

    def _consumer_op(self, op: Callable[[Planner], None]) -> None:
        self._consumer_ops.append(op)
        self._raft.wake()

    def handle_cipher(self) -> HandleCipher:
        """What turns wheel handles into the ones clients see and back (any thread); raises
        `Retryable` before the cluster's first leader set the handle key."""
        key = self._state.handle_key
        if key is None:
            raise Retryable("the cluster has no handle key yet (no leader yet); retry")
        cipher = self._cipher
        if cipher is None or cipher[0] != key:
            cipher = self._cipher = (key, HandleCipher(key))
        return cipher[1]

    def groups(self) -> Groups:
        """The replicated consumer groups (read `Groups.summary` from other threads)."""
        return self._state.groups

    def _lease_op(self, op: LeaseOp, leases: Sequence[LeaseRef],
                  deadlines_ms: Sequence[int] = ()) -> Future:
        self._require_leader()
        future: Future = Future()
        if len(self._lease_ops[op]) >= self._config.max_queued_msgs:
            raise Overloaded("max_queued_msgs")
        self._lease_ops[op].append((list(leases), list(deadlines_ms), future))
        self._raft.wake()
        return future

    def _group_op(self, create: bool, topic: str, name: str) -> Future:
        self._require_leader()
        future: Future = Future()
        self._group_ops.append((create, topic, name, future))
        self._raft.wake()
        return future

    def may_deliver(self) -> bool:
        """Whether this node still holds its lease (any thread). A sink that hands messages
        out later than `DeliverySink.deliver` checks it first: after a pause, the lease has run
        out before the Raft thread has noticed that another node leads."""
        return self._clock.monotonic_s() < self._lease_until_s

    def read_state_file(self, path: str, offset: int, size: int) -> bytes:
        """Bytes of a state file, for a peer installing a snapshot (any thread). State files
        only grow, and a snapshot only names lengths already written, so no lock is needed."""
        root = (self._data_dir / "state").resolve()
        target = (root / path).resolve()
        if root not in target.parents:
            raise ValueError(f"{path!r} is not a state file")
        with open(target, "rb") as file:
            return os.pread(file.fileno(), size, offset)

    def status(self) -> ReplicaStatus:
        raft = self._raft.status()
        groups = self._state.groups.summary()
        return ReplicaStatus(
            address=self.address, role=raft.role.name.lower(), leader=raft.leader,
            term=raft.term, commit_index=raft.commit_index,
            last_applied=raft.last_applied, cursor=self._state.cursor,
            stamp_ms=self._state.stamp_ms, dispatching=self._dispatcher.active,
            inflight_msgs=sum(group.leased for group in groups), peers=self._peers,
            connected=raft.connected, match_index=raft.match_index,
            leader_commit_index=raft.leader_commit_index,
            readied_past_cursor=self._state.readied_past_cursor,
            groups=groups,
            pending=self._state.pending.by_topic(),
            pending_untracked=self._state.pending.untracked,
            mended=replace(self._state.mended),
            damage_held=self._state.wheel.damage_held if self._dispatcher.active else None)

    # -- the loop (the Raft thread) -------------------------------------------------------

    def _run(self) -> None:
        wait_s = 0.0
        try:
            while not self._stopping.is_set():
                wait_s = self.turn(wait_s)
        except TickwheelError as error:
            self._die(f"{type(error).__name__}: {error}")
        except OSError as error:
            if error.errno not in DISK_FULL:
                log.exception("event=raft_thread_crashed")
                self._die(repr(error))
            log.critical("event=disk_full address=%s path=%s the disk is full: this node stops "
                         "rather than skip a write; free space (or grow the volume) and it "
                         "restarts from its snapshot and journal", self.address,
                         error.filename or self._data_dir)
            self._die(f"disk full: {error}", DISK_FULL_EXIT_CODE)
        except Exception as error:
            log.exception("event=raft_thread_crashed")
            self._die(repr(error))

    def turn(self, wait_s: float) -> float:
        """One turn of the loop (the Raft thread's, or a simulation's that never starts the
        thread): Raft's tick, waiting at most ``wait_s``, then the replica's step. Returns how
        long the next tick may wait."""
        self._raft.tick(wait_s)
        wait_s = self._step()
        self._state.wheel.walk_ahead(WALK_AHEAD_UNITS)
        return wait_s

    def _step(self) -> float:
        """One turn after Raft's tick; returns how long the poller may sleep."""
        now_ms = self._clock.now_ms()
        self._follow_leadership(now_ms)
        if self._leading_term is None:
            for committer in (self._committer, self._retries):
                if committer.queued_msgs:
                    committer.fail_all(NotLeader(self.leader_hint()))
            return self._config.idle_tick_ms / 1000
        self._propose_writes(now_ms)
        self._take_consumer_ops()
        self._lease_until_s = self._raft.lease_until_s(self._config.raft.lease_ms)
        if not self._dispatcher.active or self._clock.monotonic_s() >= self._lease_until_s:
            return self._config.raft.heartbeat_ms / 1000
        lead_until_ms = now_ms + self._config.dispatch.lead_ms
        taken = self._take_due(lead_until_ms)
        self._hand_out(taken, now_ms, lead_until_ms)
        self._sync_cursor(now_ms)
        return self._sleep_s(now_ms, len(taken))

    def _take_consumer_ops(self) -> None:
        planner = self._planner
        for _ in range(len(self._consumer_ops)):
            op = self._consumer_ops.popleft()
            if planner is not None:
                op(planner)

    def _hand_out(self, taken: list[DueMessage], now_ms: int, lead_until_ms: int) -> None:
        """Propose one handout of what comes due by ``lead_until_ms`` and the leases to grant;
        once it is applied, the sink gets the granted messages (to send each at its due
        time). Expired leases go to the sink too."""
        planner = self._planner
        if planner is None:
            return
        groups = self._state.groups
        plan = planner.plan(groups, taken, now_ms, lead_until_ms, self._read)
        if plan.ready or plan.grants:
            future: Future = Future()
            epoch = self._dispatcher.epoch

            def applied(done: Future) -> None:
                if self._dispatcher.epoch != epoch or self._planner is not planner:
                    return
                self._dispatcher.unapplied -= len(plan.ready)
                if done.exception() is not None:
                    planner.failed(plan)
                    return
                deliveries = planner.granted(plan, done.result(), groups)
                if deliveries:
                    self._sink.deliver(deliveries)
            future.add_done_callback(applied)
            self._propose(commands.handout(now_ms, plan.ready, plan.grants), future)
        expired = planner.expired(groups, now_ms, self._read)
        if expired:
            self._sink.expired(expired)

    def _read(self, handle: int) -> DueMessage | None:
        """A ready message's body, from the wheel (None, logged, if it cannot be read)."""
        try:
            return self._state.wheel.read(handle)[0]
        except (UnknownHandle, CorruptSegment) as error:
            log.error("event=ready_message_unreadable handle=%d error=%r", handle, str(error))
            return None

    def _take_due(self, until_ms: int) -> list[DueMessage]:
        """Messages due by ``until_ms``, at most once per ``dispatch_interval_ms`` unless a
        backlog fills whole steps."""
        now_s = self._clock.monotonic_s()
        if now_s < self._next_dispatch_s:
            return []
        deliveries = self._dispatcher.take(self._state.wheel, until_ms)
        if self._state.wheel.damage_held is not None:
            self._next_dispatch_s = now_s + DAMAGE_RETRY_S  # nothing passes it meanwhile
        elif deliveries and len(deliveries) < self._config.dispatch.max_take_msgs:
            self._next_dispatch_s = now_s + self._config.dispatch_interval_ms / 1000
        return deliveries

    def _follow_leadership(self, now_ms: int) -> None:
        leading = self._raft.is_leader()
        term = self._raft.term()
        if self._leading_term is not None and (not leading or term != self._leading_term):
            self._end_leadership()
        if leading and self._leading_term is None:
            self._leading_term = term
            self._proposed_cursor = None
            self._planner = Planner(self._config.dispatch, 0)
            key = os.urandom(HANDLE_KEY_BYTES) if self._state.handle_key is None else None
            barrier = commands.barrier(now_ms, self._state.cursor, key)
            self._propose(barrier, self._barrier_applied(term))
            log.info("event=leadership_won term=%d cursor_second=%d cursor_local_index=%d",
                     term, *self._state.cursor)

    def _barrier_applied(self, term: int) -> Future:
        future: Future = Future()

        def start_dispatch(done: Future) -> None:
            if done.exception() is None and self._leading_term == term:
                takeover_ms = self._clock.now_ms()
                self._dispatcher.begin(self._state.wheel, self._state.readied)
                planner = self._planner
                if planner is not None:
                    planner.epoch = self._dispatcher.epoch
                    for group in self._state.groups:
                        for handle, lease in group.leases.items():
                            planner.watch(lease.deadline_ms, group.id, handle, lease.seq)
                self._sink.dispatch_started(term, self._dispatcher.epoch, self._state.cursor,
                                            takeover_ms)
                log.info("event=dispatch_started term=%d takeover_ms=%d cursor_second=%d "
                         "cursor_local_index=%d readied_past_cursor=%d", term, takeover_ms,
                         *self._state.cursor, self._state.readied_past_cursor)
        future.add_done_callback(start_dispatch)
        return future

    def _end_leadership(self) -> None:
        log.info("event=leadership_lost term=%s dispatched_epoch=%d", self._leading_term,
                 self._dispatcher.epoch)
        self._leading_term = None
        self._lease_until_s = 0.0
        self._sink.dispatch_stopped(self._dispatcher.epoch)
        self._dispatcher.end()
        self._planner = None
        error = NotLeader(self.leader_hint())
        self._committer.fail_all(error)
        self._retries.fail_all(error)
        while self._cancels:
            resolve(self._cancels.popleft()[1], error=error)
        for queue in self._lease_ops.values():
            while queue:
                resolve(queue.popleft()[2], error=error)
        while self._group_ops:
            resolve(self._group_ops.popleft()[3], error=error)
        self._consumer_ops.clear()
        entries, self._inflight_entries = self._inflight_entries, {}
        for target in entries.values():
            _settle(target, None, error)

    def _propose_writes(self, now_ms: int) -> None:
        for entry in self._committer.drain():
            self._propose(commands.schedule(now_ms, entry.parts), entry)
        for entry in self._retries.drain():
            self._propose(commands.retry(now_ms, entry.parts), self._retry_applied(entry))
        while self._cancels:
            command, future, check = self._cancels.popleft()
            refused = None if check is None else check()
            if refused is not None:
                resolve(future, result=[refused])
                continue
            self._propose(command(now_ms), future)
        while self._group_ops:
            create, topic, name, future = self._group_ops.popleft()
            self._propose(commands.group(now_ms, create, topic, name), future)
        for op, queue in self._lease_ops.items():
            if queue:
                self._propose_lease_op(now_ms, op, queue)

    def _propose_lease_op(self, now_ms: int, op: LeaseOp,
                          queue: deque[tuple[list[LeaseRef], list[int], Future]]) -> None:
        """One command for every queued request of ``op``; each request gets its slice of
        the results."""
        requests = [queue.popleft() for _ in range(len(queue))]
        leases = [lease for lease_list, _, _ in requests for lease in lease_list]
        deadlines = [d for _, deadline_list, _ in requests for d in deadline_list]
        combined: Future = Future()

        def split(done: Future) -> None:
            error = done.exception()
            results = None if error is not None else done.result()
            if results is not None and op is not LeaseOp.EXTEND:
                self._lease_ended(leases, results)
            if results is not None and op is LeaseOp.EXTEND and self._planner is not None:
                for lease, deadline, took in zip(leases, deadlines, results, strict=True):
                    if took:
                        self._planner.watch(deadline, lease.group_id, lease.handle, lease.seq)
            start = 0
            for lease_list, _, future in requests:
                end = start + len(lease_list)
                resolve(future, None if results is None else results[start:end], error)
                start = end
        combined.add_done_callback(split)
        self._propose(commands.leases(now_ms, op, leases, deadlines), combined)

    def _lease_ended(self, leases: list[LeaseRef], results: list[bool]) -> None:
        planner = self._planner
        if planner is None:
            return
        for lease, took in zip(leases, results, strict=True):
            group = self._state.groups.by_id(lease.group_id)
            if took and group is not None:
                planner.resolved(lease.group_id, lease.handle, group.topic, group.name)

    def _retry_applied(self, entry: Entry) -> Future:
        """The retry entry, settled after the planner learns which leases it ended."""
        future: Future = Future()
        leases = [commands.read_retry_lease(part) for part in entry.parts]

        def settle(done: Future) -> None:
            error = done.exception()
            results = None if error is not None else done.result()
            if results is not None:
                self._lease_ended(leases, [isinstance(r, Retried) and r.handle is not None
                                           for r in results])
            entry.settle(results, error)
        future.add_done_callback(settle)
        return future

    def _sync_cursor(self, now_ms: int) -> None:
        now_s = self._clock.monotonic_s()
        if now_s - self._last_cursor_sync < self._config.cursor_sync_ms / 1000:
            return
        cursor, stamp_only = self._dispatcher.next_cursor(self._state.wheel,
                                                          self._state.readied, now_ms)
        floor = max(self._state.cursor, self._proposed_cursor or self._state.cursor)
        if cursor > floor or (stamp_only and self._proposed_cursor is None):
            self._last_cursor_sync = now_s
            self._proposed_cursor = cursor
            self._propose(commands.cursor(now_ms, cursor), self._cursor_applied())

    def _cursor_applied(self) -> Future:
        future: Future = Future()

        def clear(_: Future) -> None:
            if self._proposed_cursor is not None and self._proposed_cursor <= self._state.cursor:
                self._proposed_cursor = None
        future.add_done_callback(clear)
        return future

    def _sleep_s(self, now_ms: int, delivered: int) -> float:
        dispatch = self._config.dispatch
        if (delivered >= dispatch.max_take_msgs
                and self._dispatcher.unapplied < dispatch.max_unapplied_msgs):
            return 0.0  # a backlog: take the next step at once
        wait_s = self._config.cursor_sync_ms / 1000
        due_ms = self._state.wheel.next_due_ms()
        if due_ms is not None:
            due_ms -= dispatch.lead_ms
        if self._planner is not None:
            deadline_ms = self._planner.next_deadline_ms()
            if deadline_ms is not None:
                due_ms = deadline_ms if due_ms is None else min(due_ms, deadline_ms)
        if due_ms is not None:
            wait_s = min(wait_s, max(0, due_ms - now_ms) / 1000)
        return max(wait_s, self._next_dispatch_s - self._clock.monotonic_s())

    def _propose(self, command: bytes, target: Entry | Future) -> None:
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        self._inflight_entries[entry_id] = target

        def on_result(result: object, committed: bool) -> None:
            if self._inflight_entries.pop(entry_id, None) is None:
                return  # already failed when leadership ended
            if committed:
                _settle(target, result, None)
            else:
                _settle(target, None, NotLeader(self.leader_hint()))
        self._raft.propose(command, on_result)

    # -- the state machine's side of Raft (also on the Raft thread) ------------------------

    def _apply(self, command: bytes) -> object:
        self._bytes_since_snapshot += len(command)
        if self._bytes_since_snapshot >= self._config.raft.snapshot_min_bytes:
            self._raft.compact()
        return self._state.apply(command)

    def _serialize(self, path: str, raft_tail: tuple) -> None:
        started = self._clock.monotonic_s()
        self._bytes_since_snapshot = 0
        manifest = self._state.manifest()
        self._sync_state_files(manifest.files)
        write_snapshot(path, (tuple(manifest.cursor), manifest.stamp_ms, manifest.files,
                              manifest.pending, manifest.groups, manifest.readied,
                              manifest.handle_key, manifest.moves), raft_tail,
                       self._config.raft.fsync, self._sync_ledger)
        self._state.snapshot_written(manifest)
        log.info("event=snapshot_taken files=%d cursor_second=%d cursor_local_index=%d "
                 "duration_ms=%.1f", len(manifest.files), *manifest.cursor,
                 (self._clock.monotonic_s() - started) * 1000)

    def _deserialize(self, path: str) -> tuple:
        """Install a snapshot: this node's own at start, or one a leader sent. pysyncobj logs
        and ignores whatever this raises (then serves on state the snapshot did not set), so
        a snapshot that cannot be read stops the process here."""
        try:
            (cursor, stamp_ms, files, pending, *grouped), raft_tail = read_snapshot(path)
        except (SnapshotDamaged, OSError) as error:
            log.critical("event=node_refused reason=snapshot_damaged path=%s %s. Restore the "
                         "snapshot, or move %s away: the node then starts empty and catches up "
                         "from the leader (do that only while a majority of the other members "
                         "has its data)", path, error, self._data_dir)
            self._die(f"snapshot damaged: {error}", STORAGE_EXIT_CODE)
        manifest = Manifest(Cursor(*cursor), stamp_ms, files, pending, *grouped)
        started = self._clock.monotonic_s()
        try:
            self._state.install(manifest, self._fetch_from_peers)
        except Exception as error:
            log.exception("event=snapshot_install_failed")
            self._die(f"snapshot install failed: {error!r}")
        # a leader's snapshot: the files it names are on disk before pysyncobj clears the
        # journal it replaces (fetched, or already here but written since this node's last
        # sync: both are lost to a power cut, and the peers may have moved on)
        self._synced.clear()  # files were cut and fetched: sync every one it names
        self._sync_state_files(manifest.files)
        if self._clock.monotonic_s() - started > self._config.raft.election_min_ms / 2000:
            self._raft.postpone_election()
        if self._leading_term is not None:
            self._end_leadership()
        return raft_tail

    def _sync_state_files(self, files: dict[str, int]) -> None:
        """With ``fsync``: the state files ``files`` names that grew since their last sync (or
        are new), and the folders that hold them (a file created since the last snapshot, a
        new hour, is lost to a power cut without its entry). The files only grow, so the rest
        are on disk already: fsyncing every one, hundreds once a cluster holds many hours, held
        the Raft thread for 235-346 ms, the likely (not proven) cause of a leader deposed
        1.9 s after it won."""
        if not self._config.raft.fsync:
            return
        grown = {name for name, size in files.items() if self._synced.get(name, -1) < size}
        state_root = self._data_dir / "state"
        paths = [state_root / name for name in sorted(grown)]
        folders = {folder for path in paths for folder in path.parents
                   if folder == state_root or state_root in folder.parents}
        fsync_files([*paths, *sorted(folders, key=lambda f: len(f.parts), reverse=True)],
                    self._sync_ledger)
        self._synced = dict(files)  # every file not grown was synced at its size already

    def _fetch_from_peers(self, path: str, offset: int, size: int) -> bytes:
        return self._fetch(self._peers_leader_first(), path, offset, size)

    def _copies_from_peers(self, copies: PeerCopies, path: str, offset: int, size: int
                           ) -> Iterable[bytes | None]:
        """The peers' copies, asked once on the leader (its dispatch holds, and asks again
        later); a node that does not lead cannot go on applying without the bytes, so it asks
        again while no peer can answer, for up to ``MEND_PATIENCE_S``."""
        if self._leading_term is not None:
            return copies(self._peers_leader_first(), path, offset, size)
        return _patiently(lambda: list(copies(self._peers_leader_first(), path, offset, size)))

    def _peers_leader_first(self) -> list[str]:
        leader = self.leader_hint()
        return sorted(self._peers, key=lambda peer: peer != leader)

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

    def _die(self, reason: str, code: int = _FATAL_EXIT_CODE) -> None:
        """Stop the process loudly: the state may no longer match the log, and a restart
        rebuilds it from the snapshot and the journal."""
        log.critical("event=replica_fatal address=%s reason=%r", self.address, reason)
        logging.shutdown()
        os._exit(code)


def _settle(target: Entry | Future, result: object, error: BaseException | None) -> None:
    if isinstance(target, Entry):
        target.settle(result, error)
    else:
        resolve(target, result, error)
