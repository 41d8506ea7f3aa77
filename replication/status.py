"""What a replica reports of itself (`Replica.status`), for the node's API and metrics."""

from __future__ import annotations

from dataclasses import dataclass

from tickwheel.replication.group import GroupSummary
from tickwheel.replication.raft.port import StepSummary
from tickwheel.wheel import Cursor
from tickwheel.wheel.mending import MendCounts


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
    raft_steps: StepSummary
    """How long this node's Raft thread worked between its waits (`raft.steps`)."""
