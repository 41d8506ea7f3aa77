"""A replica's settings (`tickwheel.node.settings.config` fills them from the node's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tickwheel.replication.dispatcher import DispatchConfig
from tickwheel.replication.raft import RaftConfig
from tickwheel.replication.state import StateConfig


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    raft: RaftConfig = field(default_factory=RaftConfig)
    state: StateConfig = field(default_factory=StateConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    cursor_sync_ms: int = 50
    """The leader proposes the cursor this often, when it moved."""
    schedule_linger_ms: int = 12
    """A schedule request waits for the leader's next turn when that comes within this
    long, rather than waking it for a Raft round of its own; while messages come due, for
    the next dispatch step too (every 10 ms, at a slow rate every 20: ``DispatchConfig.
    slow_lead_ms``); 0: every request wakes it."""
    max_queued_msgs: int = 200_000
    """Schedule requests waiting for an entry; beyond it `schedule` raises `Overloaded`."""
    shard: int = 0
    """The shard this replica's group is, in a cluster of several (0 in a cluster of one): the
    handles and receipts it gives out name it (`tickwheel.replication.handle_cipher`)."""
    idle_tick_ms: int = 50
