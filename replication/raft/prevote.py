"""PreVote (the Raft thesis, 9.6) in front of pysyncobj's election, which has none.

Without it a node cut off from its peers stands for election again and again, its term
climbing, and when the link heals its next vote request deposes the healthy leader: one
needless failover per partition. Here a node whose election timer ran out first asks its peers
whether they would vote for it; only with a majority of yes does pysyncobj's real election (and
the term increment) go ahead. A peer says no while it has heard from a leader within
``election_min_ms``, when the asker's log is behind its own, when it voted for another in the
asked term, and, when it asks for the same term itself with a log alike, to an asker whose id
sorts below its own. A peer that says yes gives way: its own election waits a timeout more.
Its messages are checked field by field before use (`SHAPES`). A node its leader told to
stand (a hand-over, `tickwheel.replication.raft.handover`) stands without a round: its peers,
hearing from that leader, would refuse it.

Without the last two rules, two followers whose timers ran out within a tick of each other (a
follower's tick waits up to 50 ms, and a message wakes it) each granted the other's round,
both stood, and the vote split, again and again: 3 rounds, 2.5 s without a leader, after one
SIGKILL of a chaos run; one kill in eight of an idle cluster took a second round.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock_s

log = logging.getLogger("tickwheel.replication")

PRE_VOTE = "tickwheel_pre_vote"
PRE_VOTE_REPLY = "tickwheel_pre_vote_reply"
SHAPES: dict[str, dict[str, type]] = {
    PRE_VOTE: {"round": int, "term": int, "last_log_index": int, "last_log_term": int},
    PRE_VOTE_REPLY: {"round": int, "granted": bool},
    "append_entries": {"term": int},
}
"""The fields this module (and `RaftNode`) reads of a message, and their exact types."""
STALL_ROUND_DELAY_S = 0.05
"""How soon after a stall a node that has heard no leader yet may run a round (`after_stall`):
past pysyncobj's own check of the timer in the same tick."""


def well_formed(message: dict[str, Any], shape: dict[str, type]) -> bool:
    return all(type(message.get(name)) is kind for name, kind in shape.items())


@dataclass(slots=True)
class _Round:
    number: int
    term: int = 0
    """The term it asks for."""
    started_s: float = 0.0
    """When it was asked (``time.monotonic()``)."""
    granted: set[object] = field(default_factory=set)
    won: bool = False
    """A majority said yes: pysyncobj may campaign in the next tick."""
    spent: bool = False
    """Won already: later yeses of the same round must not start a second election."""


class PreVote:
    """The rounds of one node; reads and sets pysyncobj's election timer (pinned 0.3.17,
    checked by ``tests/replication/test_raft.py``)."""

    def __init__(self, core: SyncObj, peer_count: int, election_min_ms: int) -> None:
        self._core = core
        self._peer_count = peer_count
        self._election_min_s = election_min_ms / 1000
        self._leader_heard_s = 0.0
        self._stale_leader_heard_s = -float("inf")
        self._round = _Round(0)

    def before_tick(self) -> None:
        """When the election timer has run out, run a round instead of letting pysyncobj
        campaign; a round that a majority granted lets it campaign at once."""
        core = self._core
        if core._isLeader() or self._round.won:
            self._round.won = False  # pysyncobj campaigns in this tick; the round is spent
            return
        if (core._SyncObj__raftElectionDeadline >= raft_clock_s()  # pysyncobj's clock
                or not core._SyncObj__connectedToAnyone()
                or core._SyncObj__transferInProgress):
            return  # not yet; or its leader handed over to it (`handover`): it stands at once
        others = core._SyncObj__otherNodes
        if not others or (time.monotonic() - self._stale_leader_heard_s
                          < 2 * self._election_min_s):
            # alone, nobody to ask; or a leader with a lower term is alive, and ignored by this
            # node: only a real vote request (its higher term) can make that leader step down
            return
        self._round = _Round(self._round.number + 1, core.raftCurrentTerm + 1, time.monotonic())
        request = {"type": PRE_VOTE, "round": self._round.number,
                   "term": self._round.term,
                   "last_log_index": core._SyncObj__getCurrentLogIndex(),
                   "last_log_term": core._SyncObj__getCurrentLogTerm()}
        for node in others:
            core._SyncObj__transport.send(node, request)
        self.postpone_election()
        log.info("event=pre_vote_started round=%d term=%d", self._round.number,
                 core.raftCurrentTerm + 1)

    def on_message(self, node: object, kind: str | None, message: dict[str, Any]) -> bool:
        """Handle PreVote's own messages (True) and notice appends; ``message`` is checked."""
        if kind == PRE_VOTE:
            granted = self._grants(node, message)
            if granted:  # give way: this node's own round, if any, may not win any more
                self._round.spent = True
                self.postpone_election()
            self._core._SyncObj__transport.send(node, {"type": PRE_VOTE_REPLY,
                                                       "round": message["round"],
                                                       "granted": granted})
            return True
        if kind == PRE_VOTE_REPLY:
            self._count_grant(node, message)
            return True
        if kind == "append_entries":
            if message["term"] >= self._core.raftCurrentTerm:
                self._leader_heard_s = time.monotonic()
            else:
                self._stale_leader_heard_s = time.monotonic()
        return False

    def postpone_election(self) -> None:
        self._core._SyncObj__raftElectionDeadline = (  # pysyncobj's clock
            raft_clock_s() + self._core._SyncObj__generateRaftTimeout())

    def after_stall(self) -> None:
        """The Raft thread stalled (a long snapshot install) and its election timer may have
        run out meanwhile. A node that heard a leader since it started waits a whole timeout
        again: standing now would depose a healthy leader for its own stall. A node that has
        not (it is starting, as every member is after a restart of all) stands at its next
        tick, through a round, which the followers of a live leader refuse. Either way
        pysyncobj, which checks the timer right after an install, does not campaign without a
        round."""
        if self._leader_heard_s:
            self.postpone_election()
        else:
            self._core._SyncObj__raftElectionDeadline = (  # pysyncobj's clock
                raft_clock_s() + STALL_ROUND_DELAY_S)

    def _grants(self, node: Any, request: dict[str, Any]) -> bool:
        """Whether this node would vote for the asker (``node``) in an election now, and does
        not stand for that term itself with a greater id."""
        core = self._core
        if core._isLeader():
            return False
        if time.monotonic() - self._leader_heard_s < self._election_min_s:
            return False
        term = request["term"]
        if term < core.raftCurrentTerm:
            return False
        if term == core.raftCurrentTerm and core._SyncObj__votedForNodeId not in (None, node.id):
            return False  # it voted in that term already (for itself, as a candidate)
        ours = (core._SyncObj__getCurrentLogTerm(), core._SyncObj__getCurrentLogIndex())
        theirs = (request["last_log_term"], request["last_log_index"])
        if theirs != ours:
            return theirs > ours
        current = self._round  # logs alike: if both stand for this term, the greater id does
        standing = (current.number > 0 and not current.spent and current.term == term
                    and time.monotonic() - current.started_s < 2 * self._election_min_s)
        return not standing or str(node.id) > str(core._SyncObj__selfNode.id)

    def _count_grant(self, node: object, reply: dict[str, Any]) -> None:
        current = self._round
        if reply["round"] != current.number or current.spent or not reply["granted"]:
            return
        current.granted.add(node)
        if not self._core._isLeader() and len(current.granted) + 1 > (self._peer_count + 1) / 2:
            current.won = current.spent = True
            self._core._SyncObj__raftElectionDeadline = 0.0
            log.info("event=pre_vote_won round=%d", current.number)
