"""Leader placement: a leader hands its leadership to the member its group prefers.

In a cluster of several shards, each shard prefers one of its members (docs/shards.md), so
that at rest the shards' leaders sit on different hosts. Elections pick whoever wins: after a
failover the preferred member, back and caught up, follows. Its leader then hands over, the
Raft way (the thesis, 3.10): it stops taking proposals into its log, waits until the preferred
member holds all of it, and tells it to stand at once (pysyncobj's ``timeout_now``; PreVote
lets such a node stand without a round). The preferred member wins, its log being as long as
anyone's; the old leader steps down when it sees the higher term. Proposals made meanwhile
are held, and taken into the log if the hand-over fails or fail as on any change of leader
if it succeeds (their callers try the new leader).

A hand-over starts only once the preferred member has been connected and within
``HANDOVER_MAX_LAG`` entries for ``handover_after_ms``, and after one that did not take
effect the leader waits ``HANDOVER_BACKOFF`` times as long before the next: a preferred member
that keeps losing (a slow disk, a partition that comes and goes) costs a hold of at most an
election timeout now and then, not a flapping leadership.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj

log = logging.getLogger("tickwheel.replication")

HANDOVER_MAX_LAG = 1_000
"""How far behind the leader's log the preferred member may be and still count as caught up
(it takes the rest while proposals are held)."""
HANDOVER_BACKOFF = 10
"""After a hand-over that did not take effect, the next waits this many times longer."""

Callback = Callable[[Any, int], None]
"""pysyncobj's: ``(result, FAIL_REASON)``."""


class HandOver:
    """The hand-over of one node (``core``) to ``preferred`` (a Raft address; None: this node
    is the preferred one or its group prefers none). Call `propose` for every proposal,
    `after_tick` at the end of every tick."""

    def __init__(self, core: SyncObj, preferred: str | None, handover_after_ms: int,
                 election_min_ms: int, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._core = core
        self._preferred = preferred
        self._after_s = handover_after_ms / 1000
        self._hold_s = election_min_ms / 1000
        self._clock_s = clock_s
        self._ready_since_s: float | None = None
        self._not_before_s = 0.0
        self._holding_until_s: float | None = None
        self._sent = False
        self._held: list[tuple[bytes, Callback]] = []

    def propose(self, command: bytes, callback: Callback) -> bool:
        """Hold ``command`` while a hand-over is under way (True); False: propose it."""
        if self._holding_until_s is None:
            return False
        self._held.append((command, callback))
        return True

    def after_tick(self) -> None:
        core = self._core
        now_s = self._clock_s()
        if self._holding_until_s is not None:
            self._go_on(now_s)
            return
        target = self._target()
        if target is None:
            self._ready_since_s = None
            return
        lag = core._SyncObj__getCurrentLogIndex() - core._SyncObj__raftMatchIndex.get(target, 0)
        if lag > HANDOVER_MAX_LAG:
            self._ready_since_s = None
            return
        if self._ready_since_s is None:
            self._ready_since_s = now_s
        if now_s - self._ready_since_s >= self._after_s and now_s >= self._not_before_s:
            self._holding_until_s = now_s + self._hold_s
            self._sent = False
            log.info("event=leader_handover_started to=%s term=%d lag_entries=%d",
                     self._preferred, core.raftCurrentTerm, lag)
            self._go_on(now_s)

    def _target(self) -> Any:
        """The preferred member's node, if this node leads and it is connected."""
        core = self._core
        if self._preferred is None or not core._isLeader():
            return None
        for node in core._SyncObj__otherNodes:
            if node.address == self._preferred:
                return node if node in core._SyncObj__connectedNodes else None
        return None

    def _go_on(self, now_s: float) -> None:
        """Holding: tell the preferred member to stand once it holds the whole log; end when
        this node no longer leads (handed over) or the hold's time is up (not)."""
        core = self._core
        if not core._isLeader():
            self._end(handed_over=True)
            return
        if self._holding_until_s is not None and now_s >= self._holding_until_s:
            self._end(handed_over=False)
            return
        target = self._target()
        if target is None or self._sent:
            return
        if core._SyncObj__raftMatchIndex.get(target, 0) == core._SyncObj__getCurrentLogIndex():
            core.transferLeadership(target)
            self._sent = True

    def _end(self, handed_over: bool) -> None:
        held, self._held = self._held, []
        self._holding_until_s = None
        self._ready_since_s = None
        if handed_over:
            log.info("event=leader_handed_over to=%s leader=%s held_proposals=%d",
                     self._preferred, self._core._getLeader(), len(held))
            for _, callback in held:
                callback(None, FAIL_REASON.LEADER_CHANGED)
            return
        self._not_before_s = self._clock_s() + self._after_s * HANDOVER_BACKOFF
        log.warning("event=leader_handover_failed to=%s sent=%s held_proposals=%d: this "
                    "node leads on; it tries again in %.0f s", self._preferred, self._sent,
                    len(held), self._after_s * HANDOVER_BACKOFF)
        for command, callback in held:
            self._core.command(command, callback=callback)
