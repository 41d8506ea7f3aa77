"""The leader's tenure (the Raft literature's *leader lease*): how long it may act alone,
counted from when the leader *sent* what a majority answered.

pysyncobj stamps a follower's answer with the time it reads it. After a pause (SIGSTOP, a
stalled VM, a long swap) the first tick reads answers that followers sent before the pause and
stamps them "now": a deposed leader believed it held a fresh tenure while another node already
led, and a resumed leader sent 5 messages it had granted before the pause (CI, stop 23,
``tests/replication/test_cluster.py::test_a_paused_leader_stops_dispatching_...``).

So every AppendEntries carries the leader's send time (`SENT`, the leader's
``time.monotonic()``), a follower echoes the send time of the AppendEntries it is answering in
its answer (`ECHO` on pysyncobj's ``next_node_idx``, which a follower sends only for an
AppendEntries it accepted, having just reset its election timer), and the tenure runs
``tenure_ms`` from the send time a majority (counting the leader) has echoed. No member of that
majority can vote for another leader before that send time plus the minimum election timeout
(PreVote refuses while it has heard from a leader within it), so the tenure, half of that, runs
out first. An answer read late only shortens the tenure; it can never lengthen it.

Messages are stamped and read in place: pysyncobj builds a new dict for every message it sends,
and the extra keys are ignored by a pysyncobj that does not know them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SENT = "tickwheel_sent_s"
"""On an AppendEntries: the leader's ``time.monotonic()`` when it sent it."""
ECHO = "tickwheel_echo_s"
"""On a ``next_node_idx``: the `SENT` of the AppendEntries it answers."""


class TenureClock:
    """The stamps of one node, as leader and as follower. Raft thread only."""

    def __init__(self, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._clock_s = clock_s
        self._heard: dict[object, float] = {}
        """Follower side: the `SENT` of the latest AppendEntries from each node."""
        self._answered: dict[object, float] = {}
        """Leader side: the latest `SENT` each peer has echoed."""

    def outgoing(self, node: object, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "append_entries":
            message[SENT] = self._clock_s()
        elif kind == "next_node_idx":
            message[ECHO] = self._heard.get(node, 0.0)

    def incoming(self, node: object, message: dict[str, Any]) -> None:
        """Before pysyncobj reads ``message`` (so its answer, sent while it handles this one,
        echoes it). A stamp that is not a float counts as no stamp."""
        kind = message.get("type")
        if kind == "append_entries":
            sent = message.pop(SENT, None)
            self._heard[node] = sent if type(sent) is float else 0.0
        elif kind == "next_node_idx":
            echo = message.pop(ECHO, None)
            if type(echo) is float and echo > self._answered.get(node, 0.0):
                self._answered[node] = echo

    def until_s(self, peers_needed: int, tenure_ms: int, since_s: float) -> float:
        """``tenure_ms`` after the latest send time that ``peers_needed`` peers have echoed,
        counting only what was sent at or after ``since_s`` (when this leadership began);
        0 if fewer have answered."""
        if peers_needed == 0:
            return float("inf")
        answered = sorted((sent for sent in self._answered.values() if sent >= since_s),
                          reverse=True)
        if len(answered) < peers_needed:
            return 0.0
        return answered[peers_needed - 1] + tenure_ms / 1000
