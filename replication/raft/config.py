"""What a Raft node is told: timing, snapshots, entry sizes, and how its links are secured."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tickwheel.replication.raft.link_protocol import LinkSettings

MAX_MESSAGE_ENTRY_BYTES = 5 << 20
"""The largest entry one message can make (a 4 MiB body plus properties and framing)."""


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
    """A link that received nothing this long is dropped and redialled (at least the election
    timeout). Links between followers carry nothing until an election; with pysyncobj's default
    (3.5 s) they were often down just when a candidate's vote request needed them, which cost a
    whole extra election round."""
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
    encryption of every link (`tickwheel.replication.raft.wire`). Required with peers unless
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
    sync_ledger: Path | None = None
    """With ``fsync``: a folder where the node notes what each sync made durable, for the chaos
    harness's power cut (`tickwheel.replication.raft.durability.SyncLedger`). Testing only."""
    hold_commits_file: Path | None = None
    """Testing only (fault injection): while this file exists, a follower takes the leader's
    entries and answers, but its commit index stays where it is, so it applies nothing: an
    apply that stalls, for the watchdog's test (docs/node.md)."""
    preferred_leader: str | None = None
    """The member (Raft address) that should lead when it is up and caught up: a leader that
    is not hands over to it (`tickwheel.replication.raft.handover`). None: whoever wins."""
    handover_after_ms: int = 3_000
    """How long the preferred member must have been connected and caught up before its
    leader hands over."""
    dns_cache_ms: int = 5_000
    """How long a peer's resolved address is trusted (Kubernetes pods change IP on restart)."""
    dns_fail_cache_ms: int = 1_000
    socket_buffer_bytes: int = 1 << 20
    """Kernel send and receive buffers of each Raft link, and its read size. pysyncobj's
    64 KiB took a 256 KiB entry in several partial sends, and each one copied the
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
    def link_idle_timeout_ms(self) -> int:
        """``connection_timeout_ms``, but never below the election timeout."""
        return max(self.connection_timeout_ms, self.election_max_ms)

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame a member may send: a full append message (twice the batch, at
        worst) with pickling's overhead on small entries."""
        return 4 * self.append_batch_bytes

    @property
    def tenure_ms(self) -> int:
        """Dispatch needs a majority heard from within this long: half the minimum election
        timeout, so a deposed leader's tenure has run out before anyone else can be elected."""
        return self.election_min_ms // 2

    def __post_init__(self) -> None:
        if not 3 * self.heartbeat_ms < self.election_min_ms < self.election_max_ms:
            raise ValueError("RaftConfig needs 3 * heartbeat_ms < election_min_ms < "
                             "election_max_ms")
        if self.insecure and self.secrets:
            raise ValueError("RaftConfig: insecure and a secret exclude each other")
        if self.sync_ledger is not None and not self.fsync:
            raise ValueError("RaftConfig: sync_ledger notes what fsync made durable; it needs "
                             "fsync")

    def link_settings(self, has_peers: bool) -> LinkSettings:
        """The links' settings: with peers, the secret (or none, insecure, only when asked);
        alone, a random secret nobody else has."""
        if has_peers and not self.secrets and not self.insecure:
            raise InsecureCluster("a cluster with peers needs a Raft secret, or insecure "
                                  "set on purpose")
        secrets = (b"",) if self.insecure else (self.secrets or (os.urandom(32),))
        return LinkSettings(
            secrets=secrets, insecure=self.insecure, max_frame_bytes=self.max_frame_bytes,
            handshake_timeout_ms=self.handshake_timeout_ms,
            max_unauthenticated=self.max_unauthenticated_links,
            idle_timeout_ms=self.link_idle_timeout_ms,
            send_buffer_bytes=self.socket_buffer_bytes,
            recv_buffer_bytes=self.socket_buffer_bytes)


class InsecureCluster(ValueError):
    """Peers without a secret, and insecure not asked for."""
