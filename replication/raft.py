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
- *Its wire is pickle, open to anyone who can reach the port* (code execution, 2 GiB frame
  announcements buffered before any check, a ``status`` answer for strangers, binding
  ``0.0.0.0`` whatever the address). Its TCP connection and server are replaced by
  `tickwheel.replication.wire`'s: a handshake on the cluster's shared secret, AES-GCM frames
  of bounded size, and an unpickler that builds plain data only; the transport answers members
  only (no utility commands, no read-only nodes) and listens on exactly the node's address (or
  ``bind_address``). A cluster of more than one node needs the secret or an explicit
  ``insecure``; a node alone gets a random one, so nobody can join it. PreVote messages are
  checked field by field before use.
- *Nothing is fsynced.* The ``fsync`` option makes the journal ``msync`` every entry before it is
  acknowledged and makes snapshots ``fsync`` the state files they name; see the docs for what
  survives power loss with and without it.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pysyncobj.pickle
import pysyncobj.poller
import pysyncobj.syncobj
import pysyncobj.tcp_connection
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal
from pysyncobj.monotonic import monotonic as raft_clock_s
from pysyncobj.transport import TCPTransport
from tickwheel.replication import link_protocol, wire
from tickwheel.wheel.errors import invariant

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
# Everything pysyncobj unpickles (commands as it applies them, snapshot chunks) is plain data:
# its own loader would build any class a pickle names, and falls back to an unrestricted
# pure-Python one on error. Process-wide, through the module pysyncobj calls.
pysyncobj.pickle.loads = lambda data: link_protocol.safe_loads(pysyncobj.pickle.to_bytes(data))
pysyncobj.pickle.load = lambda file: link_protocol.safe_load(file, frozenset())
_SNAPSHOT_CLASSES = frozenset({("pysyncobj.node", "TCPNode")})
"""What a snapshot file names besides plain data: pysyncobj's member list."""


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
    secrets: tuple[bytes, ...] = ()
    """The cluster's shared secret: only nodes that know it can join, and it keys the
    encryption of every link (`tickwheel.replication.wire`). Required with peers unless
    ``insecure``. During a rotation, more than one: links are dialled with the first and
    accepted with any."""
    insecure: bool = False
    """Run the links without a secret, in the clear: anyone who reaches the port can join."""
    handshake_timeout_ms: int = 5_000
    """A link that has not proven it knows the secret within this long is dropped."""
    max_unauthenticated_links: int = 16
    """Links accepted but not yet authenticated; a new one pushes out the oldest."""
    fsync: bool = False
    """msync the journal on every entry and fsync state files at snapshots (slower)."""
    dns_cache_ms: int = 5_000
    """How long a peer's resolved address is trusted (Kubernetes pods change IP on restart)."""
    dns_fail_cache_ms: int = 1_000
    socket_buffer_bytes: int = 1 << 20
    """Kernel send and receive buffers of each Raft link (and pysyncobj's read size).
    pysyncobj's 64 KiB took a 256 KiB entry in several partial sends, and each one copied the
    rest of its write buffer: that copying was a third of a busy leader's Raft thread."""
    bind_address: str | None = None
    """Where to listen for peers when it is not the node's own address (its identity): a
    container binding ``0.0.0.0``, or a proxy standing in front of the node. Without it the
    node listens on exactly its own address."""

    @property
    def append_batch_bytes(self) -> int:
        """The most entry bytes one append message carries (pysyncobj may add one entry more);
        above the largest entry one message can make, so nothing is ever split."""
        return max(MAX_MESSAGE_ENTRY_BYTES, 2 * self.max_entry_bytes)

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame a member may send: a full append message (twice the batch, at
        worst) with pickling's overhead on small entries."""
        return 4 * self.append_batch_bytes

    @property
    def lease_ms(self) -> int:
        """Dispatch needs a majority heard from within this long: half the minimum election
        timeout, so a deposed leader's lease has run out before anyone else can be elected."""
        return self.election_min_ms // 2

    def __post_init__(self) -> None:
        if not 3 * self.heartbeat_ms < self.election_min_ms < self.election_max_ms:
            raise ValueError("RaftConfig needs 3 * heartbeat_ms < election_min_ms < "
                             "election_max_ms")
        if self.insecure and self.secrets:
            raise ValueError("RaftConfig: insecure and a secret exclude each other")

    def link_settings(self, has_peers: bool) -> link_protocol.LinkSettings:
        """The links' settings: with peers, the secret (or none, insecure, only when asked);
        alone, a random secret nobody else has."""
        if has_peers and not self.secrets and not self.insecure:
            raise InsecureCluster("a cluster with peers needs a Raft secret, or insecure "
                                  "set on purpose")
        secrets = (b"",) if self.insecure else (self.secrets or (os.urandom(32),))
        return link_protocol.LinkSettings(
            secrets=secrets, insecure=self.insecure, max_frame_bytes=self.max_frame_bytes,
            handshake_timeout_ms=self.handshake_timeout_ms,
            max_unauthenticated=self.max_unauthenticated_links,
            idle_timeout_ms=max(self.connection_timeout_ms, self.election_max_ms),
            send_buffer_bytes=self.socket_buffer_bytes,
            recv_buffer_bytes=self.socket_buffer_bytes)


class InsecureCluster(ValueError):
    """Peers without a secret, and insecure not asked for."""


Serializer = Callable[[str, tuple], None]
Deserializer = Callable[[str], tuple]


class RaftNode(SyncObj):
    """A pysyncobj node with one replicated method, `command`, whose argument is bytes."""

    def __init__(self, self_address: str, peers: list[str], raft_dir: Path, config: RaftConfig,
                 apply: Callable[[bytes], object], snapshot: tuple[Serializer, Deserializer]
                 ) -> None:
        self._apply_command = apply
        self._peer_addresses = list(peers)
        links = config.link_settings(has_peers=bool(peers))
        if config.insecure:
            log.warning("event=raft_insecure peers=%d: Raft links run without a secret, in "
                        "the clear: anyone who can reach %s can join this cluster, read "
                        "every message and rewrite its log", len(peers),
                        config.bind_address or self_address)
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_ms / 1000,
            appendEntriesBatchSizeBytes=config.append_batch_bytes,
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
            bindAddress=config.bind_address,
            # pysyncobj caches a peer's address for 600 s; a restarted pod comes back with a
            # new IP under the same name, and only one side of a link ever dials.
            dnsCacheTime=config.dns_cache_ms / 1000,
            dnsFailCacheTime=config.dns_fail_cache_ms / 1000,
            commandsWaitLeader=False,
        )
        raft_dir.mkdir(parents=True, exist_ok=True)
        # pysyncobj has no journal option; its module-level factory is the only seam.
        original, pysyncobj.syncobj.createJournal = (pysyncobj.syncobj.createJournal,
                                                     _MsyncJournal if config.fsync
                                                     else FileJournal)
        self._election_min_s = config.election_min_ms / 1000
        self._leader_heard_s = 0.0
        self._stale_leader_heard_s = -float("inf")
        self._pre_vote = _PreVoteRound(0, set())
        try:
            super().__init__(self_address, peers, conf,
                             transportClass=functools.partial(_LinkTransport, links=links))
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

    def _on_message(self, node: object, message: object) -> None:
        """Every Raft message comes here first: PreVote's own, and what it must notice.
        PreVote's messages are checked field by field first (a malformed one is dropped and
        logged); pysyncobj's own come from authenticated members only."""
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in _SHAPES and not _well_formed(message, _SHAPES[kind]):
            log.warning("event=raft_message_malformed type=%s peer=%s fields=%r", kind, node,
                        sorted(map(repr, message))[:8])
            return
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
_SHAPES: dict[str, dict[str, type]] = {
    _PRE_VOTE: {"round": int, "term": int, "last_log_index": int, "last_log_term": int},
    _PRE_VOTE_REPLY: {"round": int, "granted": bool},
    "append_entries": {"term": int},
}
"""The fields `RaftNode._on_message` reads, and their exact types."""


def _well_formed(message: dict, shape: dict[str, type]) -> bool:
    return all(type(message.get(name)) is kind for name, kind in shape.items())


class _LinkTransport(TCPTransport):
    """pysyncobj's TCP transport on `wire.Link`s: it listens on exactly its address, and a
    link counts only once it has proven the secret and named a member. pysyncobj's utility
    commands (``status``, ``add``, ...) and read-only nodes are not offered."""

    def __init__(self, syncObj: SyncObj, selfNode: object, otherNodes: object, *,
                 links: link_protocol.LinkSettings) -> None:
        self._links = links
        super().__init__(syncObj, selfNode, otherNodes)

    def _createServer(self) -> None:
        address = self._syncObj.conf.bindAddress or self._selfNode.address
        host, port = address.rsplit(":", 1)
        self._server = wire.LinkServer(self._syncObj._poller, host, int(port),
                                       self._onNewIncomingConnection, self._links)

    def addNode(self, node: object) -> None:
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            link = wire.Link(self._syncObj._poller, self._links)
            link.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, link))
            link.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            link.setOnDisconnectedCallback(functools.partial(self._onDisconnected, link))
            self._connections[node] = link

    def _onIncomingMessageReceived(self, conn: wire.Link, message: object) -> None:
        """The first message of an accepted, authenticated link: the member it comes from."""
        self._unknownConnections.discard(conn)
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
        if node is None:
            conn.refuse("not_a_member", claimed=repr(message)[:100])
            return
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onTick(self) -> None:
        super()._onTick()
        now_s = time.monotonic()
        for link in [*self._connections.values(), *self._unknownConnections]:
            link.check_deadlines(now_s)


invariant((wire.DISCONNECTED, wire.CONNECTING, wire.CONNECTED) == (
    pysyncobj.tcp_connection.CONNECTION_STATE.DISCONNECTED,
    pysyncobj.tcp_connection.CONNECTION_STATE.CONNECTING,
    pysyncobj.tcp_connection.CONNECTION_STATE.CONNECTED),
    "the link layer speaks pysyncobj's connection states by value")
invariant((wire.READ, wire.WRITE, wire.ERROR) == (
    pysyncobj.poller.POLL_EVENT_TYPE.READ, pysyncobj.poller.POLL_EVENT_TYPE.WRITE,
    pysyncobj.poller.POLL_EVENT_TYPE.ERROR), "the link layer speaks pysyncobj's poller events")


@dataclass(slots=True)
class _PreVoteRound:
    number: int
    granted: set
    won: bool = False
    """A majority said yes: pysyncobj may campaign in the next tick."""
    spent: bool = False
    """Won already: later yeses of the same round must not start a second election."""


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
    """Plain data and pysyncobj's member list; any other class named in the file is refused
    (the file comes from the leader)."""
    with open(path, "rb") as file:
        return link_protocol.safe_load(file, _SNAPSHOT_CLASSES)


def fsync_files(paths: list[Path]) -> None:
    """fsync each file (or folder: its entries)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
