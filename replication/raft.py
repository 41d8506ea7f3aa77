"""pysyncobj, configured and wrapped so that its traps cannot reach the wheel.

What pysyncobj 0.3.17 does, and what this module does about it (see ``docs/replication.md``):

- *It runs everything on a tick thread.* Here there is no tick thread: `RaftNode` is built with
  ``autoTick=False`` and `tickwheel.replication.Replica` calls `RaftNode.tick` (``doTick``) from
  its own thread, which then also dispatches. One thread owns the wheel: applying, snapshotting,
  installing, taking due messages.
- *One call is one entry, and entries of 64 KiB or more are split wrongly.* Group commit packs
  messages into entries of at most ``max_entry_bytes``; ``appendEntriesBatchSizeBytes`` is set
  above the largest entry a single message can make, so nothing is ever split.
- *Callbacks of calls made on followers get lost.* Commands are proposed only on the leader.
- *An isolated leader stays leader for 30 s.* ``leaderFallbackTimeout`` is the election
  timeout, and dispatch additionally needs a `lease`: a majority heard from within half the
  minimum election timeout, checked before every dispatch step.
- *Snapshots pickle the object.* A custom serializer writes only a `Manifest` (file lengths).
- *It has no PreVote.* A node cut off from its peers stands for election again and again, its
  term climbing, and when the link heals its next vote request deposes the healthy leader: one
  needless failover per partition. `RaftNode` adds the PreVote round of the Raft thesis (9.6):
  a node whose election timer ran out first asks its peers whether they would vote for it; only
  with a majority of yes does pysyncobj's real election (and the term increment) go ahead. A
  peer says no while it has heard from a leader within ``election_min_ms`` or when the asker's
  log is behind its own.
- *Nothing is fsynced.* The ``fsync`` option makes the journal ``msync`` every entry before it is
  acknowledged and makes snapshots ``fsync`` the state files they name; see the docs for what
  survives power loss with and without it.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pysyncobj.pickle
import pysyncobj.syncobj
import pysyncobj.tcp_connection
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal
from pysyncobj.monotonic import monotonic as raft_clock_s

log = logging.getLogger("tickwheel.replication")

MAX_MESSAGE_ENTRY_BYTES = 5 << 20
"""The largest entry one message can make (a 4 MiB body plus properties and framing)."""
PICKLE_PROTOCOL = 5
"""What pysyncobj pickles its messages, log entries and commands with. It says 2, which has no
bytes type: every command's bytes went through a latin-1 string and back when the command was
proposed, once per follower in each AppendEntries, and again when each replica applied it
(~1 us a 140-byte message on the leader, 100 times protocol 5's cost). Any node reads any
protocol, so nodes that differ here still understand each other."""
setattr(pysyncobj.pickle, "__protocol", PICKLE_PROTOCOL)  # process-wide, as pysyncobj's is


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_min_ms: int = 500
    """A follower that hears nothing from the leader for a random time between this and
    ``election_max_ms`` stands for election."""
    election_max_ms: int = 800
    heartbeat_ms: int = 50
    """How often the leader sends (possibly empty) appends."""
    connection_retry_ms: int = 100
    connection_timeout_ms: int = 10_000
    """A link that received nothing this long is dropped and redialled. Links between followers
    carry nothing until an election; with pysyncobj's default (3.5 s, here it must be at least
    the election timeout) they are often down just when a candidate's vote request needs them,
    which costs a whole extra election round."""
    snapshot_min_entries: int = 5_000
    """A snapshot (a list of file lengths) is taken after this many entries, ..."""
    snapshot_min_bytes: int = 32 << 20
    """...or this many bytes of entries (pysyncobj keeps the log since the last snapshot in
    memory, so this bounds it), ..."""
    snapshot_min_interval_ms: int = 60_000
    """...or this long after the last one, whichever comes first."""
    max_entry_bytes: int = 256 << 10
    """Group commit packs messages into entries of at most this size."""
    password: str | None = None
    """Encrypts and authenticates Raft traffic (which is pickle): always set it outside tests."""
    fsync: bool = False
    """msync the journal on every entry and fsync state files at snapshots (slower)."""
    dns_cache_ms: int = 5_000
    """How long a peer's resolved address is trusted (Kubernetes pods change IP on restart)."""
    dns_fail_cache_ms: int = 1_000
    socket_buffer_bytes: int = 1 << 20
    """Kernel send and receive buffers of each Raft link (and pysyncobj's read size).
    pysyncobj's 64 KiB took a 256 KiB entry in several partial sends, and each one copied the
    rest of its write buffer: that copying was a third of a busy leader's Raft thread."""
    wire_compression_level: int = 0
    """zlib level of every message to a peer. pysyncobj compresses at level 3, twice per
    entry on a leader of three: 1.4 us per 100-byte message and follower, 4.5 us when bodies do
    not compress, on a loaded core; 0 stores the bytes (any pysyncobj peer still reads them)."""
    bind_address: str | None = None
    """Where to listen for peers when it is not the node's own address (its identity): a
    container binding ``0.0.0.0``, or a proxy standing in front of the node."""

    @property
    def lease_ms(self) -> int:
        """Dispatch needs a majority heard from within this long: half the minimum election
        timeout, so a deposed leader's lease has run out before anyone else can be elected."""
        return self.election_min_ms // 2

    def __post_init__(self) -> None:
        if not 3 * self.heartbeat_ms < self.election_min_ms < self.election_max_ms:
            raise ValueError("RaftConfig needs 3 * heartbeat_ms < election_min_ms < "
                             "election_max_ms")


Serializer = Callable[[str, tuple], None]
Deserializer = Callable[[str], tuple]


class RaftNode(SyncObj):
    """A pysyncobj node with one replicated method, `command`, whose argument is bytes."""

    def __init__(self, self_address: str, peers: list[str], raft_dir: Path, config: RaftConfig,
                 apply: Callable[[bytes], object], snapshot: tuple[Serializer, Deserializer]
                 ) -> None:
        self._apply_command = apply
        self._peer_addresses = list(peers)
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_ms / 1000,
            appendEntriesBatchSizeBytes=max(MAX_MESSAGE_ENTRY_BYTES, 2 * config.max_entry_bytes),
            sendBufferSize=config.socket_buffer_bytes,
            recvBufferSize=config.socket_buffer_bytes,
            raftMinTimeout=config.election_min_ms / 1000,
            raftMaxTimeout=config.election_max_ms / 1000,
            leaderFallbackTimeout=config.election_min_ms / 1000,
            connectionTimeout=max(config.connection_timeout_ms, config.election_max_ms) / 1000,
            connectionRetryTime=config.connection_retry_ms / 1000,
            logCompactionMinEntries=config.snapshot_min_entries,
            logCompactionMinTime=config.snapshot_min_interval_ms / 1000,
            journalFile=str(raft_dir / "journal"),
            fullDumpFile=str(raft_dir / "snapshot"),
            serializer=snapshot[0],
            deserializer=snapshot[1],
            password=config.password,
            bindAddress=config.bind_address,
            # pysyncobj caches a peer's address for 600 s; a restarted pod comes back with a
            # new IP under the same name, and only one side of a link ever dials.
            dnsCacheTime=config.dns_cache_ms / 1000,
            dnsFailCacheTime=config.dns_fail_cache_ms / 1000,
            commandsWaitLeader=False,
        )
        raft_dir.mkdir(parents=True, exist_ok=True)
        # pysyncobj has no compression option; the module it calls is the only seam.
        pysyncobj.tcp_connection.zlib = _WireZlib(config.wire_compression_level)
        # pysyncobj has no journal option; its module-level factory is the only seam.
        original, pysyncobj.syncobj.createJournal = (pysyncobj.syncobj.createJournal,
                                                     _MsyncJournal if config.fsync
                                                     else FileJournal)
        self._election_min_s = config.election_min_ms / 1000
        self._leader_heard_s = 0.0
        self._stale_leader_heard_s = -float("inf")
        self._pre_vote = _PreVoteRound(0, set())
        try:
            super().__init__(self_address, peers, conf)
        finally:
            pysyncobj.syncobj.createJournal = original
        self._SyncObj__transport.setOnMessageReceivedCallback(self._on_message)

    @replicated
    def command(self, data: bytes) -> object:
        return self._apply_command(data)

    def lease_until_s(self, lease_ms: int) -> float:
        """The ``time.monotonic()`` time until which this leader holds its lease: ``lease_ms``
        after the latest time by which a majority (counting itself) had answered; 0 if not
        leader.

        pysyncobj stamps answers with its own clock, CLOCK_MONOTONIC_RAW, not
        ``time.monotonic()`` (CLOCK_MONOTONIC, which NTP slews). The two drift apart: on the
        benchmark VM they were 248 ms apart an hour after boot, which left a 250 ms lease
        about 2 ms long (dispatch stalled until the next answer: the ~55 ms p99 at 1,000 and
        5,000 msg/s); drift the other way would stretch the lease past the election timeout.
        So the lease is measured on pysyncobj's clock and only then moved to ours."""
        if not self._isLeader():
            return 0.0
        # The time each peer last answered the leader; pysyncobj keeps it but does not expose it
        # (pinned to 0.3.17, checked by tests/replication/test_units.py).
        answered = sorted(self._SyncObj__lastResponseTime.values(), reverse=True)
        peers_needed = (len(self._peer_addresses) + 1) // 2
        if peers_needed == 0:
            return float("inf")
        if len(answered) < peers_needed:
            return 0.0
        remaining_s = answered[peers_needed - 1] + lease_ms / 1000 - raft_clock_s()
        return time.monotonic() + remaining_s

    def tick(self, wait_s: float) -> None:
        """`doTick`, with the PreVote round in front of pysyncobj's election."""
        self._gate_election()
        self.doTick(wait_s)

    def _gate_election(self) -> None:
        """When the election timer has run out, run a PreVote round instead of letting
        pysyncobj campaign; a round that a majority granted lets it campaign at once."""
        if self._isLeader() or self._pre_vote.won:
            self._pre_vote.won = False  # pysyncobj campaigns in this tick; the round is spent
            return
        if (self._SyncObj__raftElectionDeadline >= raft_clock_s()  # pysyncobj's clock
                or not self._SyncObj__connectedToAnyone()):
            return
        others = self._SyncObj__otherNodes
        if not others or (time.monotonic() - self._stale_leader_heard_s
                          < 2 * self._election_min_s):
            # alone, nobody to ask; or a leader with a lower term is alive, and ignored by this
            # node: only a real vote request (its higher term) can make that leader step down
            return
        self._pre_vote = _PreVoteRound(self._pre_vote.number + 1, set())
        request = {"type": _PRE_VOTE, "round": self._pre_vote.number,
                   "term": self.raftCurrentTerm + 1,
                   "last_log_index": self._SyncObj__getCurrentLogIndex(),
                   "last_log_term": self._SyncObj__getCurrentLogTerm()}
        for node in others:
            self._SyncObj__transport.send(node, request)
        self.postpone_election()
        log.info("event=pre_vote_started round=%d term=%d", self._pre_vote.number,
                 self.raftCurrentTerm + 1)

    def _on_message(self, node: object, message: dict) -> None:
        """Every Raft message comes here first: PreVote's own, and what it must notice."""
        kind = message.get("type")
        if kind == _PRE_VOTE:
            self._SyncObj__transport.send(node, {"type": _PRE_VOTE_REPLY,
                                                 "round": message["round"],
                                                 "granted": self._grants(message)})
            return
        if kind == _PRE_VOTE_REPLY:
            self._count_grant(node, message)
            return
        if kind == "append_entries":
            if message["term"] >= self.raftCurrentTerm:
                self._leader_heard_s = time.monotonic()
            else:
                self._stale_leader_heard_s = time.monotonic()
        self._SyncObj__onMessageReceived(node, message)

    def _grants(self, request: dict) -> bool:
        """Whether this node would vote for the asker in an election now."""
        if self._isLeader():
            return False
        if time.monotonic() - self._leader_heard_s < self._election_min_s:
            return False
        if request["term"] < self.raftCurrentTerm:
            return False
        ours = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
        return (request["last_log_term"], request["last_log_index"]) >= ours

    def _count_grant(self, node: object, reply: dict) -> None:
        round_ = self._pre_vote
        if reply["round"] != round_.number or round_.spent or not reply["granted"]:
            return
        round_.granted.add(node)
        if not self._isLeader() and len(round_.granted) + 1 > (len(self._peer_addresses) + 1) / 2:
            round_.won = round_.spent = True
            self._SyncObj__raftElectionDeadline = 0.0
            log.info("event=pre_vote_won round=%d", self._pre_vote.number)

    def postpone_election(self) -> None:
        """Restart the election timer: after a long snapshot install the follower has heard
        nothing for a while, through no fault of the leader's; standing for election then
        would depose a healthy leader."""
        self._SyncObj__raftElectionDeadline = (raft_clock_s()  # pysyncobj's clock
                                               + self._SyncObj__generateRaftTimeout())


_PRE_VOTE = "tickwheel_pre_vote"
_PRE_VOTE_REPLY = "tickwheel_pre_vote_reply"


@dataclass(slots=True)
class _PreVoteRound:
    number: int
    granted: set
    won: bool = False
    """A majority said yes: pysyncobj may campaign in the next tick."""
    spent: bool = False
    """Won already: later yeses of the same round must not start a second election."""


class _WireZlib:
    """What pysyncobj's connections use as ``zlib``: compress at our level, not theirs."""

    def __init__(self, level: int) -> None:
        self._level = level
        self.decompress = zlib.decompress

    def compress(self, data: bytes, _level: int) -> bytes:
        return zlib.compress(data, self._level)


class _MsyncJournal(FileJournal):
    """A journal that reaches the disk before pysyncobj acknowledges an entry."""

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self.flush()

    def setCurrentTerm(self, term: int, votedForNodeId: object) -> None:
        super().setCurrentTerm(term, votedForNodeId)
        meta = Path(self._FileJournal__metaStorer.getPath())
        fsync_files([meta, meta.parent])


def write_snapshot(path: str, manifest: object, raft_tail: tuple, fsync: bool) -> None:
    """Write the snapshot file pysyncobj renames into place (and streams to followers)."""
    with open(path, "wb") as file:
        pickle.dump((manifest, raft_tail), file, protocol=pickle.HIGHEST_PROTOCOL)
        if fsync:
            file.flush()
            os.fsync(file.fileno())


def read_snapshot(path: str) -> tuple[object, tuple]:
    with open(path, "rb") as file:
        return pickle.load(file)


def fsync_files(paths: list[Path]) -> None:
    """fsync each file (or folder: its entries)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
