"""The simulated Raft port of the seeded simulation (`simulation`): one committed log, the term
and the leader, and each node's view of them, driven by a simulated clock.

The simulated Raft keeps Raft's promises and no more: one committed log that every member
applies in order; a leader whose tenure ran out is not replaced before it has (election timeout
> tenure); a change of leader fails every answer the old leader was waiting for, while the
entries themselves may or may not survive; a partitioned leader goes on believing it leads,
its proposals never commit, and its tenure runs out. A node may take a snapshot (the replica's
own serializer), and a crashed node comes back as a new `Replica` on its files, from its own
latest snapshot or a peer's (installed by the replica's own deserializer, which fetches the
missing bytes from the peers' files) and then the rest of the log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tickwheel.replication.raft import OnResult, RaftConfig, RaftStatus, Role
from tickwheel.replication.raft.port import PeerClock

EPOCH_MS = 1_800_000_000_000
ELECTION_MS = RaftConfig().election_min_ms
ROUND_TRIP_MS = 2
"""How far below a peer's clock the leader's estimate of it is (an answer's round trip)."""


class World:
    """Simulated time: ``now_s`` on the monotonic scale; true wall time ``EPOCH_MS + now_s``."""

    def __init__(self) -> None:
        self.now_s = 0.0

    @property
    def wall_ms(self) -> int:
        return EPOCH_MS + int(self.now_s * 1000)


@dataclass
class NodeClock:
    """One replica's `Clock`: the world's, its wall time off by ``skew_ms``."""

    world: World
    skew_ms: int = 0

    def now_ms(self) -> int:
        return self.world.wall_ms + self.skew_ms

    def monotonic_s(self) -> float:
        return self.world.now_s


class SimRaft:
    """One member's `RaftPort` on the shared `SimCluster`. Built by the replica with
    ``(address, peers, raft_dir, config, apply, (serialize, deserialize))``; a snapshot file
    in ``raft_dir`` is installed at the first tick, as pysyncobj does."""

    def __init__(self, cluster: SimCluster, address: str, raft_dir: Path,
                 apply: Callable[[bytes], object],
                 snapshot: tuple[Callable[[str, tuple], None], Callable[[str], tuple]]) -> None:
        self.cluster = cluster
        self.address = address
        self._apply = apply
        self._serialize, self._deserialize = snapshot
        self.snapshot_path = raft_dir / "snapshot"
        self._load_snapshot = self.snapshot_path.exists()
        self.applied = 0
        self.believed_term = 0
        self.believes_leader = False
        self.heard_majority_s = 0.0
        self.clocks: dict[str, PeerClock] = {}
        self.doomed: list[tuple[bytes | None, OnResult]] = []
        """What this node proposed while cut off (the command; None for an entry a new leader
        dropped): answered False when it learns of a newer term, or, for a leader whose
        partition heals before anyone replaced it, replicated then (`SimCluster.heal`)."""

    def tick(self, wait_s: float) -> None:
        if self._load_snapshot:
            self._load_snapshot = False
            (self.applied,) = self._deserialize(str(self.snapshot_path))
        if self.address in self.cluster.isolated:
            return
        self._learn()
        cluster = self.cluster
        while self.applied < cluster.commit:
            index = self.applied
            self.applied += 1
            result = self._apply(cluster.log[index][1])
            waiting = cluster.pending.get(index)
            if waiting is not None and waiting[0] == self.address:
                del cluster.pending[index]
                waiting[1](result, True)

    def _learn(self) -> None:
        """A node that can hear the others knows the current term and leader."""
        cluster = self.cluster
        if self.believed_term != cluster.term:
            self.believed_term = cluster.term
            self.believes_leader = cluster.leader == self.address
            doomed, self.doomed = self.doomed, []
            for _, on_result in doomed:
                on_result(None, False)
        if self.believes_leader:
            now_s = cluster.world.now_s
            self.heard_majority_s = now_s
            self.clocks = self.clocks | {  # every peer that hears the leader answers it
                peer: PeerClock(clock.now_ms() - ROUND_TRIP_MS - now_s * 1000, ROUND_TRIP_MS,
                                now_s)
                for peer, clock in cluster.clocks.items()
                if peer != self.address and peer not in cluster.isolated}

    def wake(self) -> None:
        pass

    def propose(self, command: bytes, on_result: OnResult) -> None:
        cluster = self.cluster
        if self.address in cluster.isolated or cluster.leader != self.address:
            self.doomed.append((command, on_result))
            return
        cluster.log.append((cluster.term, command))
        cluster.pending[len(cluster.log) - 1] = (self.address, on_result)

    def is_leader(self) -> bool:
        return self.believes_leader

    def term(self) -> int:
        return self.believed_term

    def leader(self) -> str | None:
        return self.cluster.leader if self.address not in self.cluster.isolated else None

    def tenure_until_s(self, tenure_ms: int) -> float:
        if not self.believes_leader:
            return 0.0
        return self.heard_majority_s + tenure_ms / 1000

    def peer_clocks(self) -> dict[str, PeerClock]:
        return self.clocks

    def compact(self) -> None:
        self.take_snapshot()

    def take_snapshot(self) -> None:
        """What pysyncobj does at a compaction: the replica writes its manifest."""
        self.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        self._serialize(str(self.snapshot_path), (self.applied,))

    def postpone_election(self) -> None:
        pass

    def status(self) -> RaftStatus:
        cluster = self.cluster
        return RaftStatus(role=Role.LEADER if self.believes_leader else Role.FOLLOWER,
                          term=self.believed_term, leader=self.leader(),
                          commit_index=cluster.commit, last_applied=self.applied,
                          leader_commit_index=cluster.commit, connected=(), match_index={})

    def close(self) -> None:
        pass


@dataclass
class SimCluster:
    """The one committed log, the term and the leader, as Raft guarantees them."""

    world: World
    rng: random.Random
    log: list[tuple[int, bytes]] = field(default_factory=list)
    commit: int = 0
    term: int = 0
    leader: str | None = None
    pending: dict[int, tuple[str, OnResult]] = field(default_factory=dict)
    """Log index -> (proposer, its answer), until the proposer applies it or loses office."""
    isolated: set[str] = field(default_factory=set)
    nodes: dict[str, SimRaft] = field(default_factory=dict)
    clocks: dict[str, NodeClock] = field(default_factory=dict)
    """Every member's clock, which its answers tell the leader."""

    def can_elect(self) -> bool:
        """Raft's election timeout is longer than the tenure: a new leader only after the old
        one's tenure has run out (it heard no majority for that long)."""
        old = self.nodes.get(self.leader) if self.leader else None
        return old is None or (self.world.now_s >= old.heard_majority_s + ELECTION_MS / 1000)

    def elect(self, address: str) -> None:
        self.term += 1
        self.leader = address
        if self.rng.random() < 0.5:
            del self.log[self.commit:]  # the old leader's tail did not reach the new one
        for index in sorted(self.pending):
            proposer, on_result = self.pending.pop(index)
            if proposer not in self.isolated:
                on_result(None, False)  # its leadership ended before the answer
            else:
                self.nodes[proposer].doomed.append((None, on_result))

    def heal(self) -> None:
        """The partition ends. A leader that nobody replaced meanwhile still leads, and what
        it proposed while cut off reaches the others now (Raft keeps its log)."""
        self.isolated.clear()
        node = self.nodes.get(self.leader) if self.leader else None
        if node is None or node.believed_term != self.term:
            return
        doomed, node.doomed = node.doomed, []
        for command, on_result in doomed:
            if command is None:
                on_result(None, False)
                continue
            self.log.append((self.term, command))
            self.pending[len(self.log) - 1] = (node.address, on_result)

    def replicate(self) -> None:
        """The leader, if it hears a majority, commits everything it has."""
        if self.leader is not None and self.leader not in self.isolated:
            self.commit = len(self.log)
