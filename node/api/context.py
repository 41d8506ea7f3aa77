"""What the node's services share: the replica, the courier and the rest of one process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tickwheel.common.clock import Clock
from tickwheel.node.api import validation
from tickwheel.node.api.admission import Admission
from tickwheel.node.api.forward import Forwarder
from tickwheel.node.api.placement import LiveShardMap, ShardMap
from tickwheel.node.api.unary import UnaryConsumers
from tickwheel.node.delivery.courier import Courier
from tickwheel.node.delivery.levels import RetryPolicy
from tickwheel.node.ops.disk import DiskWatch
from tickwheel.node.ops.metrics import Metrics
from tickwheel.node.security.identity import PeerCallers
from tickwheel.node.security.quotas import Quotas
from tickwheel.replication import Replica


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What the services share."""

    replica: Replica
    courier: Courier
    members: dict[str, str]
    """Raft address -> gRPC address, for every member."""
    peers: dict[str, str]
    """Raft address -> peer listener address, for every member (none for a node alone)."""
    peer_callers: PeerCallers
    limits: validation.Limits
    retry: RetryPolicy
    """The delay level table (``delay_level``) and the retry ladder."""
    clock: Clock
    metrics: Metrics
    forwarder: Forwarder
    unary: UnaryConsumers
    disk: DiskWatch
    """Every member's free space: new messages wait while one is below its reserve."""
    admission: Admission
    """Calls and request bytes held now, over every listener (`tickwheel.node.api.admission`)."""
    shard_map: LiveShardMap
    """Every shard's members, and this node's shard (`tickwheel.node.api.placement`)."""
    quotas: Quotas
    """What each principal holds against its quotas here (`tickwheel.node.security.quotas`)."""
    rocketmq_address: str = ""
    """Where the other members' RocketMQ routes name this node's RocketMQ listener; "" for
    none."""
    ledger_folder: Path | None = None
    """This node's ledger (`tickwheel.node.ledger`), which the ``Ledger`` service reads; None
    for a node run ``--no-ledger``."""
    rotate_ledger: Callable[[], None] | None = None
    """Close the ledger's open segment (and return once it is closed)."""

    @property
    def shards(self) -> ShardMap:
        """The shard map in force now."""
        return self.shard_map.current()

    def leader_grpc(self, raft_address: str | None) -> str | None:
        return None if raft_address is None else self.members.get(raft_address)

    def leader_peer(self, raft_address: str | None) -> str | None:
        return None if raft_address is None else self.peers.get(raft_address)
