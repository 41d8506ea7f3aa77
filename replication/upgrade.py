"""The cluster version on the replica: what it writes now, and the finalize that raises it
(`tickwheel.common.versions` has the rule; docs/replication.md#compatibility the procedure).

The version is replicated state (`StateMachine.cluster_version`, set by ``finalize``
commands, carried by snapshots), so every member writes the same formats at the same entry.
`Upgrade.finalize` runs on the leader: it proposes this build's `CURRENT` only while every
member has answered within `FRESH_ANSWER_S` with a version at least that
(`tickwheel.replication.raft.versions`), and otherwise refuses naming the member. A member
rolled back to an older release between that check and the commit stops on the entry it
cannot read, loudly, as an older member of a finalized cluster does.

`Upgrade.require` is the gate of each later format: the proposer of a command of a newer
version asks it first (``GrowShards``' shard map: `tickwheel.replication.requests`).
Called by the replica (`Replica.upgrade`) and, through it, the node's ``FinalizeUpgrade``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from tickwheel.common.errors import NotLeader, VersionConflict
from tickwheel.common.versions import CURRENT, describe, require
from tickwheel.replication import commands
from tickwheel.replication.proposals import Applied
from tickwheel.replication.raft import RaftPort
from tickwheel.replication.raft.versions import MemberVersion, older
from tickwheel.replication.requests import Requests
from tickwheel.replication.state import StateMachine

FRESH_ANSWER_S = 5.0
"""How recently a member must have answered the leader for its version to count: a follower
answers every AppendEntries, at least one a heartbeat (``heartbeat_ms``)."""


class Upgrade:
    """The cluster version of one replica. `finalize` on any thread, on the leader."""

    def __init__(self, raft: RaftPort, peers: Sequence[str], state: StateMachine,
                 requests: Requests, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._raft = raft
        self._peers = tuple(peers)
        self._state = state
        self._requests = requests
        self._clock_s = clock_s

    @property
    def cluster_version(self) -> int:
        """The formats the cluster writes now (any thread)."""
        return self._state.cluster_version

    def member_versions(self) -> dict[str, MemberVersion]:
        """Each peer's version as of its latest message: on the leader, every follower's; on
        a follower, its leader's (any thread)."""
        return self._raft.status().member_versions

    def finalize(self) -> Applied:
        """Propose `CURRENT` as the cluster version; the future gets the version in force
        once applied. Raises `NotLeader` on a follower (the call is forwarded), `VersionConflict`
        naming a member that answers with an older version or has not answered lately, or a
        leader of an older version."""
        if not self._raft.is_leader():
            leader = self._raft.leader()
            seen = self.member_versions().get(leader or "")
            if seen is not None and seen.version < CURRENT:  # it would not know the call
                raise VersionConflict("cluster_version", f"cannot finalize at "
                                      f"{describe(CURRENT)}: the leader, member {leader}, "
                                      f"writes cluster version {describe(seen.version)}: "
                                      "upgrade it first")
            raise NotLeader(leader)
        if self._state.cluster_version >= CURRENT:
            done: Applied = Future()
            done.set_result(self._state.cluster_version)
            return done
        held = older(self.member_versions(), self._peers, CURRENT, FRESH_ANSWER_S,
                     self._clock_s())
        if held is not None:
            raise VersionConflict("cluster_version", f"cannot finalize at "
                                  f"{describe(CURRENT)}: {held}")
        return self._requests.handle_op(lambda now_ms, _: commands.finalize(now_ms, CURRENT), None)

    def require(self, version: int, what: str) -> None:
        """Raise `VersionConflict` unless the cluster writes ``version``'s formats."""
        require(self._state.cluster_version, version, what)

