"""What ``ClusterInfo`` answers, as the library's own types (frozen dataclasses, like every
other answer of the client), so that callers never handle the generated protobuf messages.

The fields mirror the API's (`proto/tickwheel/v1/tickwheel.proto`, docs/node.md), name for name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from tickwheel.v1 import tickwheel_pb2 as pb


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the cluster, as the answering node sees it."""

    raft_address: str
    grpc_address: str
    role: str
    """``leader``, ``follower``, or ``unknown`` (seen from the leader)."""
    connected: bool
    lag_entries: int
    """On the leader: entries this follower has not yet matched."""
    version: int = 0
    """The cluster version its build writes: the answering node's own, and on the leader each
    follower's as it last answered; 0 unknown (docs/replication.md#compatibility)."""
    clock_known: bool = False
    """On the leader: whether it has an estimate of this member's clock."""
    clock_offset_ms: int = 0
    """This member's clock minus the leader's: at least this, at most ``clock_error_ms`` more."""
    clock_error_ms: int = 0
    disk_known: bool = False
    """Whether the answering node has a current report of this member's disk."""
    free_bytes: int = 0
    reserve_bytes: int = 0
    """Its ``min_free_bytes``: below it, the cluster refuses new messages."""


@dataclass(frozen=True, slots=True)
class TopicDue:
    """On the leader: a topic's due messages."""

    topic: str
    ready: int
    """Due, waiting for a consumer with credits."""
    unacked: int
    """Delivered, waiting for an acknowledgement."""
    consumers: int
    delivered: int = 0
    """Sent by the leader since it started, every attempt: a rate is the difference of two
    answers of one leader."""


@dataclass(frozen=True, slots=True)
class TopicPending:
    """A topic's messages scheduled and not yet done (replicated: the same on every node)."""

    topic: str
    pending: int


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group: ``ready``, ``leased`` and ``dropped`` are replicated, ``consumers``
    (open streams) is the leader's."""

    topic: str
    group: str
    ready: int
    leased: int
    consumers: int
    dropped: int


@dataclass(frozen=True, slots=True)
class Shard:
    """A shard of the cluster (an independent Raft group), as the answering node knows it."""

    shard: int
    grpc_addresses: tuple[str, ...]
    """Its members' client addresses."""
    leader_grpc: str
    """Its leader's gRPC address, if the answering node knows it ("" if not)."""


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The cluster as one node sees it."""

    address: str
    """The answering node's Raft address."""
    role: str
    leader: str
    """The leader's Raft address, "" if unknown."""
    leader_grpc: str
    """The leader's gRPC address, "" if unknown."""
    term: int
    commit_index: int
    last_applied: int
    cursor_second: int
    cursor_local_index: int
    stamp_ms: int
    dispatching: bool
    cursor_lag_ms: int
    pending_untracked: int
    readied_past_cursor: int
    members: tuple[Member, ...]
    topics: tuple[TopicDue, ...]
    pending: tuple[TopicPending, ...]
    groups: tuple[GroupInfo, ...]
    shard: int = 0
    """The shard the answering node serves."""
    shards: tuple[Shard, ...] = ()
    """Every shard, in order; empty in a cluster of one shard."""
    map_version: int = 1
    """The version of that shard map: 1 until the cluster grows (docs/shards.md)."""
    cluster_version: int = 0
    """The formats the cluster writes (replicated): 1 is 0.0.4's, kept after an upgrade from
    it until `Client.finalize_upgrade`; 0 from a node of 0.0.4."""


_Part = TypeVar("_Part", "Member", "TopicDue", "TopicPending", "GroupInfo")


def _plain(kind: type[_Part], message: Any) -> _Part:
    """``kind`` from the fields of the same names in ``message``."""
    return kind(**{field.name: getattr(message, field.name) for field in fields(kind)})


def cluster_info(response: pb.ClusterInfoResponse) -> ClusterInfo:
    nested = {"members", "topics", "pending", "groups", "shards"}
    scalars = {field.name: getattr(response, field.name) for field in fields(ClusterInfo)
               if field.name not in nested}
    return ClusterInfo(members=tuple(_plain(Member, m) for m in response.members),
                       topics=tuple(_plain(TopicDue, t) for t in response.topics),
                       pending=tuple(_plain(TopicPending, p) for p in response.pending),
                       groups=tuple(_plain(GroupInfo, g) for g in response.groups),
                       shards=tuple(Shard(s.shard, tuple(s.grpc_addresses), s.leader_grpc)
                                    for s in response.shards), **scalars)
