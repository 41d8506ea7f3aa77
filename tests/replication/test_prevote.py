"""PreVote between two followers whose election timers ran out at once (in process: a fake of
the pysyncobj attributes PreVote reads, pinned by tests/replication/test_raft.py)."""

from __future__ import annotations

from typing import Any

from tickwheel.replication.raft.prevote import PRE_VOTE, PRE_VOTE_REPLY, PreVote


class Node:
    def __init__(self, node_id: str) -> None:
        self.id = node_id


class Core:
    """What PreVote reads and sets of a `SyncObj`: a follower in ``term`` with a log alike to
    its peers', whose election timer ran out."""

    def __init__(self, node_id: str, peers: list[Node], term: int = 9) -> None:
        self.raftCurrentTerm = term
        self._SyncObj__selfNode = Node(node_id)
        self._SyncObj__otherNodes = peers
        self._SyncObj__votedForNodeId: str | None = None
        self._SyncObj__raftElectionDeadline = 0.0
        self._SyncObj__transferInProgress = False
        self.outbox: list[tuple[Node, dict[str, Any]]] = []
        self._SyncObj__transport = self

    def send(self, node: Node, message: dict[str, Any]) -> None:
        self.outbox.append((node, message))

    def _isLeader(self) -> bool:
        return False

    def _SyncObj__connectedToAnyone(self) -> bool:
        return True

    def _SyncObj__getCurrentLogIndex(self) -> int:
        return 120

    def _SyncObj__getCurrentLogTerm(self) -> int:
        return 9

    def _SyncObj__generateRaftTimeout(self) -> float:
        return 0.5


def exchange(cores: dict[str, Core], votes: dict[str, PreVote]) -> None:
    """Deliver every message sent to a running node, replies included, until none is left."""
    while any(core.outbox for core in cores.values()):
        for sender, core in cores.items():
            outbox, core.outbox = core.outbox, []
            for node, message in outbox:
                if node.id in votes:
                    votes[node.id].on_message(Node(sender), message["type"], message)


def winners(peers_of: dict[str, list[str]]) -> list[str]:
    cores = {name: Core(name, [Node(peer) for peer in peers]) for name, peers in peers_of.items()}
    votes = {name: PreVote(core, len(peers_of[name]), 500) for name, core in cores.items()}  # type: ignore[arg-type]
    for vote in votes.values():  # both timers ran out before either tick read a message
        vote.before_tick()
    exchange(cores, votes)
    return sorted(name for name, vote in votes.items() if vote._round.won)


def test_two_followers_that_stand_at_once_do_not_both_win_the_round() -> None:
    # Before: each granted the other's round, both stood for the same term, and the vote split.
    assert winners({"a:1": ["b:2"], "b:2": ["a:1"]}) == ["b:2"]
    # Of three, the third (killed leader) gone: the survivors' round still has one winner.
    assert winners({"a:1": ["b:2", "c:3"], "b:2": ["a:1", "c:3"]}) == ["b:2"]


def test_a_follower_that_granted_a_round_gives_way() -> None:
    core = Core("a:1", [Node("b:2")])
    vote = PreVote(core, 1, 500)  # type: ignore[arg-type]
    asked = {"type": PRE_VOTE, "round": 1, "term": 10, "last_log_index": 120, "last_log_term": 9}
    vote.on_message(Node("b:2"), PRE_VOTE, asked)
    assert core.outbox[-1][1] == {"type": PRE_VOTE_REPLY, "round": 1, "granted": True}
    assert core._SyncObj__raftElectionDeadline > 0  # its own election waits a timeout more
    core._SyncObj__votedForNodeId = "a:1"  # it stood and voted for itself in term 10 after all
    core.raftCurrentTerm = 10
    vote.on_message(Node("b:2"), PRE_VOTE, asked | {"round": 2})
    assert core.outbox[-1][1]["granted"] is False
