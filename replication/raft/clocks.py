"""The peers' clocks as the leader sees them: each answer to an AppendEntries carries the
follower's clock.

A follower stamps every ``next_node_idx`` (its answer to an AppendEntries) with its clock
(`WALL`, Unix ms, from the node's injected clock, so a skewed or stepped clock shows as it
is). The answer also echoes the leader's send time (`tickwheel.replication.raft.tenure.ECHO`),
so the leader, reading it at ``t_read`` on its monotonic clock, knows the follower read its
clock between ``ECHO`` and ``t_read``: the follower's clock at any later leader time ``t`` is at
least ``WALL + (t - t_read)`` and at most the round trip more (clocks run at the same rate;
they may be set anywhere). The lower bound is what dispatch uses
(`tickwheel.replication.cluster_clock`): it can only make a message late, never early.

The latest estimate of each peer is kept in a dict that is replaced, never changed, so other
threads (the courier's) read it without a lock. Older nodes send no `WALL`: their answers give
no estimate. A `WALL` that is not a plausible integer is dropped and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tickwheel.replication.raft.port import PeerClock
from tickwheel.replication.raft.tenure import ECHO

log = logging.getLogger("tickwheel.replication")

WALL = "tickwheel_wall_ms"
"""On a ``next_node_idx``: the answering node's clock, Unix ms, when it sent it."""
MAX_WALL_MS = 1 << 53
"""No plausible clock reads beyond this (year 285,000); a float can hold every int below it."""


class PeerClocks:
    """The clock stamps of one node, as follower (`outgoing`) and as leader (`incoming`)."""

    def __init__(self, wall_ms: Callable[[], int],
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._wall_ms = wall_ms
        self._clock_s = clock_s
        self.estimates: dict[str, PeerClock] = {}
        """Peer address -> its latest estimate; replaced whole on every change."""

    def outgoing(self, message: dict[str, Any]) -> None:
        if message.get("type") == "next_node_idx":
            message[WALL] = self._wall_ms()

    def incoming(self, node: object, message: dict[str, Any]) -> None:
        """Before `TenureClock.incoming`, which takes the `ECHO` off the message."""
        if message.get("type") != "next_node_idx" or WALL not in message:
            return
        wall_ms, echo_s = message.pop(WALL), message.get(ECHO)
        if type(wall_ms) is not int or not 0 < wall_ms < MAX_WALL_MS:
            log.warning("event=raft_message_malformed type=next_node_idx peer=%s field=%s "
                        "value=%r", node, WALL, repr(wall_ms)[:40])
            return
        read_s = self._clock_s()
        if type(echo_s) is not float or not 0 < echo_s <= read_s:
            return  # no send time to bound the round trip with
        address = str(getattr(node, "address", node))
        self.estimates = {**self.estimates, address: PeerClock(
            base_ms=wall_ms - read_s * 1000, error_ms=(read_s - echo_s) * 1000,
            heard_s=read_s)}
