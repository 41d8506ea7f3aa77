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
    max_queued_msgs: int = 200_000
    """Schedule requests waiting for an entry; beyond it `schedule` raises `Overloaded`."""
    idle_tick_ms: int = 50
    dispatch_interval_ms: int = 4
    """After a dispatch step that handed messages over, the next waits this long unless a full
    step (``max_take_msgs``) was taken: a step costs about the same whether it carries one
    message or fifty (the Raft loop, the hand-over to the event loop, a journal write, a gRPC
    write per consumer), and with 1 ms steps those costs outweighed the messages. The first
    message after a quiet spell still goes out at its due time."""
