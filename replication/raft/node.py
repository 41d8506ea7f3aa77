"""pysyncobj, configured and wrapped so that its traps cannot reach the wheel.

What pysyncobj 0.3.17 does, and what this module does about it (see ``docs/replication.md``):

- *It runs everything on a tick thread.* Here there is no tick thread: pysyncobj is built with
  ``autoTick=False`` and `tickwheel.replication.Replica` calls `RaftNode.tick` (``doTick``) from
  its own thread, which then also dispatches. One thread owns the wheel: applying, snapshotting,
  installing, taking due messages.
- *One call is one entry, and entries of 64 KiB or more are split wrongly.* Group commit packs
  messages into entries of at most ``max_entry_bytes``; ``appendEntriesBatchSizeBytes`` is set
  above the largest entry a single message can make, so nothing is ever split.
- *Callbacks of calls made on followers get lost.* Commands are proposed only on the leader.
- *An isolated leader stays leader for 30 s.* ``leaderFallbackTimeout`` is the election
  timeout, and dispatch additionally needs tenure (`tickwheel.replication.raft.tenure`): a
  majority answered something sent within half the minimum election timeout, checked before
  every dispatch step. pysyncobj's own record of answers stamps them when read, which a pause
  turns into a fresh tenure for a deposed leader.
- *Every proposal and every apply is a round of AppendEntries.* Without batching, pysyncobj
  sends an AppendEntries to every follower for each command it takes into the log, and again
  after each tick that applied anything (the commit index alone), and wakes its own poller
  through a pipe for each command: at 1,000 due messages a second a leader sent 3.2 messages
  an entry and read as many answers, each send a turn of a follower. Here pysyncobj batches
  (``appendEntriesUseBatch``), and `RaftNode` sends once a tick, after pysyncobj has taken
  the tick's proposals into the log: one AppendEntries per follower carrying all of them and
  the commit index. A tick that only applied sends nothing: the followers learn the commit
  index from the next AppendEntries, at the latest the heartbeat (``heartbeat_ms``).
- *Snapshots pickle the object.* A custom serializer writes only a `Manifest` (file lengths).
- *A follower installs any snapshot its leader sends*, even one older than what it applied:
  `ReceivingSerializer` refuses those, and the leader is told where this node's log ends.
- *A follower installs a snapshot inside the tick that reads its last chunk*, answering
  nothing until every file it names is fetched: here the files are gathered off the Raft
  thread first, the follower answering its leader meanwhile
  (`tickwheel.replication.raft.catch_up`).
- *It has no PreVote* (`tickwheel.replication.raft.prevote` adds it).
- *It has no leader placement*: `tickwheel.replication.raft.handover` hands leadership to the
  group's preferred member (``preferred_leader``) with pysyncobj's ``transferLeadership``,
  proposals held meanwhile, since pysyncobj takes them into the log during a transfer.
- *Its names leak everywhere* (private attributes, a role compared as ``== 2``, status keys
  built from peer names, ``FAIL_REASON``). `RaftNode` *contains* its ``SyncObj`` and offers the
  small typed `RaftPort`; nothing outside this package imports pysyncobj.
- *Its wire is pickle, open to anyone who can reach the port* (code execution, 2 GiB frame
  announcements buffered before any check, a ``status`` answer for strangers, binding
  ``0.0.0.0`` whatever the address). Its TCP connection and server are replaced by
  `tickwheel.replication.raft.wire`'s: a handshake on the cluster's shared secret, AES-GCM frames
  of bounded size, and an unpickler that builds plain data only; the transport answers members
  only (no utility commands, no read-only nodes) and listens on exactly the node's address (or
  ``bind_address``). A cluster of more than one node needs the secret or an explicit
  ``insecure``; a node alone gets a random one, so nobody can join it. PreVote messages are
  checked field by field before use.
- *A follower receiving a snapshot commits its own log* (``min(leader's commit, my last
  index)`` from every AppendEntries, snapshot chunks too): a deposed leader applied its own
  uncommitted entries and diverged. Snapshot chunks no longer move the commit index.
- *A late answer sends a follower back.* An acknowledgement sets the follower's next index to
  its own position even when the leader has sent further since: the leader sent entries again,
  or its snapshot again and again. An acknowledgement here moves that index forward only.
- *Nothing is fsynced.* The ``fsync`` option makes the journal ``msync`` every entry before it is
  acknowledged and makes snapshots ``fsync`` the state files they name; see the docs for what
  survives power loss with and without it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pysyncobj.pickle
import pysyncobj.syncobj
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.pipe_notifier import PipeNotifier

from tickwheel.common.clock import SystemClock
from tickwheel.replication.raft import link_protocol
from tickwheel.replication.raft.catch_up import CatchUp
from tickwheel.replication.raft.clocks import PeerClocks
from tickwheel.replication.raft.config import RaftConfig
from tickwheel.replication.raft.durability import SyncLedger
from tickwheel.replication.raft.handover import HandOver
from tickwheel.replication.raft.journal import JOURNAL_FILE, AtomicJournal, MsyncJournal
from tickwheel.replication.raft.port import (
    OnResult,
    PeerClock,
    Prefetch,
    RaftStatus,
    Role,
    Taking,
)
from tickwheel.replication.raft.prevote import SHAPES, PreVote, well_formed
from tickwheel.replication.raft.snapshot import (
    SNAPSHOT_FILE,
    DurableSerializer,
    ReceivingSerializer,
)
from tickwheel.replication.raft.steps import StepTimes
from tickwheel.replication.raft.tenure import TenureClock
from tickwheel.replication.raft.transport import LinkTransport
from tickwheel.replication.raft.versions import MemberVersions

log = logging.getLogger("tickwheel.replication")

PICKLE_PROTOCOL = 5
"""What pysyncobj pickles its messages, log entries and commands with. It says 2, which has no
bytes type: every command's bytes went through a latin-1 string and back when the command was
proposed, once per follower in each AppendEntries, and again when each replica applied it
(~1 us a 140-byte message on the leader, 100 times protocol 5's cost). Any node reads any
protocol, so nodes that differ here still understand each other."""
setattr(pysyncobj.pickle, "__protocol", PICKLE_PROTOCOL)  # process-wide, as pysyncobj's is
# Everything pysyncobj unpickles (commands as it applies them, snapshot chunks) is plain data:
# its own loader would build any class a pickle names, and falls back to an unrestricted
# pure-Python one on error. Process-wide, through the module pysyncobj calls.
pysyncobj.pickle.loads = lambda data: link_protocol.safe_loads(pysyncobj.pickle.to_bytes(data))
pysyncobj.pickle.load = lambda file: link_protocol.safe_load(file, frozenset())

Serializer = Callable[[str, tuple[Any, ...]], None]
Deserializer = Callable[[str], tuple[Any, ...]]


APPLY_SLICE_S = 0.02
"""A tick applies committed entries for at most this long (and at least one entry)."""


class _Core(SyncObj):
    """pysyncobj's node with one replicated method, `command`, whose argument is bytes; and
    its applying of committed entries sliced: pysyncobj applies every committed entry in
    one tick, so a follower catching up on thousands of entries, or a leader whose entries
    commit together after a pause, answered and sent nothing for as long as that took.
    A tick applies for `APPLY_SLICE_S`; the rest wait for the next tick, which comes at once
    (``left_over`` wakes the poller the tick ends with)."""

    _SyncObj__raftCommitIndex: int
    _SyncObj__raftLastApplied: int

    def __init__(self, apply: Callable[[bytes], object], *args: object,
                 **kwargs: object) -> None:
        self._apply_command = apply
        self.left_over: Callable[[], None] = lambda: None
        self.holding: Callable[[], bool] = lambda: False
        """Applying and taking snapshots wait (a snapshot's files are gathered: `CatchUp`)."""
        super().__init__(*args, **kwargs)

    def _SyncObj__tryLogCompaction(self) -> None:
        if not self.holding():
            super()._SyncObj__tryLogCompaction()

    def _SyncObj__applyLogEntries(self) -> bool:
        if self.holding():
            return False
        commit = self._SyncObj__raftCommitIndex
        if commit - self._SyncObj__raftLastApplied <= 1:
            return bool(super()._SyncObj__applyLogEntries())
        ends = time.monotonic() + APPLY_SLICE_S
        send = False
        try:  # pysyncobj's own applying, an entry at a time: it applies up to the commit index
            while self._SyncObj__raftLastApplied < commit and time.monotonic() < ends:
                self._SyncObj__raftCommitIndex = self._SyncObj__raftLastApplied + 1
                send = bool(super()._SyncObj__applyLogEntries()) or send
        finally:
            self._SyncObj__raftCommitIndex = commit
        if self._SyncObj__raftLastApplied < commit:
            self.left_over()
        return send

    @replicated
    def command(self, data: bytes) -> object:
        return self._apply_command(data)


class RaftNode:
    """A `RaftPort` on pysyncobj: one member of the cluster at ``self_address``.

    ``apply(command)`` runs on the Raft thread for every committed command, in log order, on
    every member; ``snapshot`` is ``(serialize(path, raft_tail), deserialize(path) ->
    raft_tail)``; ``wall_ms`` is the node's clock, which its answers carry to the leader
    (`tickwheel.replication.raft.clocks`); with ``prefetch``, a snapshot from the leader is
    loaded once its files are gathered (`CatchUp`), else at once; with ``taking``, this
    node's snapshots are taken over several ticks by it (``serialize`` is then not called),
    else each in one."""

    def __init__(self, self_address: str, peers: list[str], raft_dir: Path, config: RaftConfig,
                 apply: Callable[[bytes], object], snapshot: tuple[Serializer, Deserializer],
                 wall_ms: Callable[[], int] | None = None,
                 prefetch: Prefetch | None = None, taking: Taking | None = None) -> None:
        self._peers = tuple(peers)
        self._tenure = TenureClock()
        self._clocks = PeerClocks(wall_ms or SystemClock().now_ms)
        self._versions = MemberVersions()
        self._leading: tuple[int, float] | None = None
        self._hold_file = config.hold_commits_file
        """The term this node leads and when it first saw itself leading it."""
        links = config.link_settings(has_peers=bool(peers))
        if config.insecure:
            log.warning("event=raft_insecure peers=%d: Raft links run without a secret, in "
                        "the clear: anyone who can reach %s can join this cluster, read "
                        "every message and rewrite its log", len(peers),
                        config.bind_address or self_address)
        raft_dir.mkdir(parents=True, exist_ok=True)
        self._catch_up = CatchUp(prefetch, self.wake)
        # pysyncobj has no option for its journal or its snapshot handler; its module-level
        # names are the only seam.
        ledger = None if config.sync_ledger is None else SyncLedger(config.sync_ledger)
        journal, serializer = pysyncobj.syncobj.createJournal, pysyncobj.syncobj.Serializer
        pysyncobj.syncobj.createJournal = functools.partial(
            MsyncJournal if config.fsync else AtomicJournal, ledger=ledger)
        pysyncobj.syncobj.Serializer = functools.partial(
            DurableSerializer if config.fsync else ReceivingSerializer, ledger=ledger,
            applied=self._last_applied, whole=self._catch_up.begin, taking=taking)
        try:
            self._core = _Core(apply, self_address, list(peers), _conf(config, raft_dir,
                                                                         snapshot),
                               transportClass=functools.partial(LinkTransport, links=links,
                                                                 tenure=self._tenure,
                                                                 clocks=self._clocks,
                                                                 versions=self._versions))
        finally:
            pysyncobj.syncobj.createJournal, pysyncobj.syncobj.Serializer = journal, serializer
        self._pre_vote = PreVote(self._core, len(peers), config.election_min_ms)
        self._catch_up.bind(self._core)
        self._core.holding = lambda: self._catch_up.fetching
        self._core._SyncObj__transport.setOnMessageReceivedCallback(self._on_message)
        self.steps = StepTimes()
        """How long this node's Raft thread works between waits (`raft.steps`)."""
        self.steps.wrap(self._core._poller)
        self._notifier = PipeNotifier(self._core._poller)
        self._woken = False
        """A wake's byte is in the pipe, or the tick it ends has not returned yet."""
        self._core.left_over = self.wake
        self._sent_through: tuple[int, int] = (0, 0)
        """(index, term) of the last entry in the log at this leader's latest send."""
        self._core.addOnTickCallback(self._send_new_entries)
        self._handover = HandOver(self._core, None if config.preferred_leader == self_address
                                  else config.preferred_leader, config.handover_after_ms,
                                  config.election_min_ms)
        self._core.addOnTickCallback(self._handover.after_tick)

    # -- the port -------------------------------------------------------------------------

    def tick(self, wait_s: float) -> None:
        """`doTick`, with the PreVote round in front of pysyncobj's election (and a snapshot
        whose files are gathered loaded first)."""
        self._catch_up.before_tick()
        self._pre_vote.before_tick()
        self._core.doTick(wait_s)
        self._woken = False

    def wake(self) -> None:
        """Once per tick at most: what other threads queue before the tick returns is read by
        the step that follows it (`RaftPort.wake`), so a second byte in the pipe would only
        cost a write here and a turn there."""
        if not self._woken:
            self._woken = True
            self._notifier.notify()

    def propose(self, command: bytes, on_result: OnResult) -> None:
        def callback(result: object, reason: int) -> None:
            on_result(result, reason == FAIL_REASON.SUCCESS)
        if not self._handover.propose(command, callback):  # held while handing over
            self._core.command(command, callback=callback)

    def is_leader(self) -> bool:
        return bool(self._core._isLeader())

    def term(self) -> int:
        return int(self._core.raftCurrentTerm)

    def leader(self) -> str | None:
        leader = self._core._getLeader()
        return None if leader is None else leader.address

    def tenure_until_s(self, tenure_ms: int) -> float:
        """The ``time.monotonic()`` time until which this leader holds its tenure: ``tenure_ms``
        after the latest send time a majority (counting itself) has answered, counting only
        what it sent since it saw itself leading this term; 0 if not leader."""
        if not self._core._isLeader():
            self._leading = None
            return 0.0
        term = int(self._core.raftCurrentTerm)
        if self._leading is None or self._leading[0] != term:
            self._leading = (term, time.monotonic())
        return self._tenure.until_s((len(self._peers) + 1) // 2, tenure_ms, self._leading[1])

    def peer_clocks(self) -> dict[str, PeerClock]:
        return self._clocks.estimates

    def compact(self) -> None:
        self._core.forceLogCompaction()

    def postpone_election(self) -> None:
        """After a long snapshot install: a follower has heard nothing for a while, through no
        fault of its leader's, and waits a whole election timeout again; a node that has heard
        no leader since it started stands through a PreVote round at its next tick
        (`PreVote.after_stall`)."""
        self._pre_vote.after_stall()

    def status(self) -> RaftStatus:
        raw = self._core.getStatus()
        leader = raw["leader"]
        return RaftStatus(
            role=Role(raw["state"]), term=raw["raft_term"],
            leader=None if leader is None else leader.address,
            commit_index=raw["commit_idx"], last_applied=raw["last_applied"],
            leader_commit_index=raw["leader_commit_idx"] or 0,
            connected=tuple(peer for peer in self._peers
                            if raw.get(f"partner_node_status_server_{peer}") == 2),
            match_index={peer: raw[f"match_idx_server_{peer}"] for peer in self._peers
                         if f"match_idx_server_{peer}" in raw},
            steps=self.steps.summary(), member_versions=self._versions.heard)

    def close(self) -> None:
        self._core.destroy()

    def _last_applied(self) -> int:
        """The last entry this node applied (what a snapshot received must be newer than)."""
        return int(self._core._SyncObj__raftLastApplied)

    # -- what pysyncobj calls on the Raft thread -------------------------------------------

    def _send_new_entries(self) -> None:
        """At the end of each tick, before pysyncobj polls (an on-tick callback): if the log
        grew since the last send, one AppendEntries to each follower with everything new
        (pysyncobj sends what each follower lacks, and the commit index). Sending restarts
        pysyncobj's heartbeat period, so a busy leader sends no heartbeats besides."""
        core = self._core
        if not core._isLeader():
            return
        last = (core._SyncObj__getCurrentLogIndex(), core._SyncObj__getCurrentLogTerm())
        if last != self._sent_through:
            self._sent_through = last
            core._SyncObj__sendAppendEntries()

    # -- every message passes here first ----------------------------------------------------

    def _on_message(self, node: object, message: object) -> None:
        """PreVote's messages (and the fields of others that PreVote reads) are checked field
        by field first: a malformed one is dropped and logged. pysyncobj's own messages come
        from authenticated members only."""
        leader_commit = None
        if isinstance(message, dict):
            kind = message.get("type")
            if kind in SHAPES and not well_formed(message, SHAPES[kind]):
                log.warning("event=raft_message_malformed type=%s peer=%s fields=%r", kind,
                            node, sorted(map(repr, message))[:8])
                return
            self._clocks.incoming(node, message)  # reads the echo the tenure clock takes off
            self._versions.incoming(node, message)
            self._tenure.incoming(node, message)
            screened = self._catch_up.screen(kind, message)
            if screened is None:
                return
            message = screened
            if kind == "append_entries" and ("prevLogIdx" not in message or (
                    self._hold_file is not None and self._hold_file.exists())):
                leader_commit = self._hold_commit(message)
            if self._pre_vote.on_message(node, kind, message):
                return
        next_index = self._next_index_before_success(node, message)
        self._core._SyncObj__onMessageReceived(node, message)
        serializer = self._core._SyncObj__serializer
        if serializer.refused:  # a snapshot no newer than what this node applied
            serializer.refused = False
            self._core._SyncObj__sendNextNodeIdx(node, reset=True)  # where this log ends
        if leader_commit is not None:  # status and health still report the leader's
            self._core._SyncObj__leaderCommitIndex = leader_commit
        if next_index is not None:
            sent_to = self._core._SyncObj__raftNextIndex
            sent_to[node] = max(sent_to.get(node, next_index), next_index)
        self._catch_up.answer(node, message.get("type") if isinstance(message, dict) else None)

    def _next_index_before_success(self, node: object, message: object) -> int | None:
        """Where this leader sends ``node`` from, before an answer that acknowledges what
        it sent: such an answer may move that point forward, never back. pysyncobj sets it
        to the answer's own position, and answers arrive late: the leader has already sent
        further (it sends without waiting), or has sent its snapshot and moved past the
        snapshot's index. Moved back below the log's start, it sent the snapshot again, once
        per late answer, and the follower installed each, older than what it had applied
        (the chaos runner: a wiped follower installed one snapshot 44 times in 15 s and
        answered nothing meanwhile). Moved back within the log, it sent entries again, and
        the follower cut applied entries to take them. A refusal (``reset``) still sets it
        wherever the follower says."""
        if (isinstance(message, dict) and message.get("type") == "next_node_idx"
                and message.get("success") is True and not message.get("reset")):
            next_index = self._core._SyncObj__raftNextIndex.get(node)
            return next_index if type(next_index) is int else None
        return None

    def _hold_commit(self, message: dict[str, Any]) -> int | None:
        """A chunk of the leader's snapshot says nothing about this follower's log, so it must
        not move the commit index. pysyncobj takes the leader's commit index "as far as my log
        goes" from every AppendEntries, these included: a deposed leader catching up by
        snapshot applied its own uncommitted entries (proposals of its lost term, which the
        new leader's log does not hold) and its state diverged for good (`make chaos`, stop
        24: entries only it had filed, then a crash loop on its wheel's index). Raft allows
        a commit only up to the last entry known to match the leader's; the snapshot's own
        load sets the commit index when it is whole. Returns the leader's commit index when
        it was held back."""
        held = self._core._SyncObj__raftCommitIndex
        leader_commit = message.get("commit_index")
        if type(leader_commit) is not int or leader_commit <= held:
            return None
        message["commit_index"] = held
        return leader_commit


def _conf(config: RaftConfig, raft_dir: Path, snapshot: tuple[Serializer, Deserializer]
          ) -> SyncObjConf:
    return SyncObjConf(
        autoTick=False,
        # pysyncobj sends only heartbeats; `RaftNode._send_new_entries` sends the rest.
        appendEntriesUseBatch=True,
        appendEntriesPeriod=config.heartbeat_ms / 1000,
        appendEntriesBatchSizeBytes=config.append_batch_bytes,
        raftMinTimeout=config.election_min_ms / 1000,
        raftMaxTimeout=config.election_max_ms / 1000,
        leaderFallbackTimeout=config.election_min_ms / 1000,
        # Our links time out on their own (the same value); pysyncobj still checks this one.
        connectionTimeout=config.link_idle_timeout_ms / 1000,
        connectionRetryTime=config.connection_retry_ms / 1000,
        logCompactionMinEntries=config.snapshot_min_entries,
        logCompactionMinTime=config.snapshot_min_interval_ms / 1000,
        journalFile=str(raft_dir / JOURNAL_FILE),
        fullDumpFile=str(raft_dir / SNAPSHOT_FILE),
        serializer=snapshot[0],
        deserializer=snapshot[1],
        bindAddress=config.bind_address,
        # pysyncobj caches a peer's address for 600 s; a restarted pod comes back with a
        # new IP under the same name, and only one side of a link ever dials.
        dnsCacheTime=config.dns_cache_ms / 1000,
        dnsFailCacheTime=config.dns_fail_cache_ms / 1000,
        commandsWaitLeader=False,
    )
