"""The watchdog on the replica's applied index: a node never stays up applying nothing.

A node whose applied index stands still while its commit index (or its leader's, as it last
heard it) moves on is stuck: pysyncobj catches what a failed snapshot load raises, and a
follower so stuck still answers its leader and looks alive. Past ``stall_health_elections``
election timeouts of it, health reports NOT_SERVING and the reason is logged
(``event=apply_stalled``); past ``stall_exit_elections``, the node stops with
`EXIT_STALLED` (``event=replica_fatal ... code=EXIT_STALLED``), and a restart (the kubelet's,
or an operator's) rebuilds it from its snapshot and journal, or says why it cannot.

Also the test hook that makes apply stall on purpose: with ``fault_injection``, while
``DATA/hold-commits`` exists the follower's commit index is held
(`RaftConfig.hold_commits_file`). The node's housekeeping calls `ApplyWatchdog.check` (on the
loop).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tickwheel.common.exits import EXIT_STALLED, Die, die

log = logging.getLogger("tickwheel.node")

HOLD_COMMITS_FILE = "hold-commits"
"""Testing only: while ``DATA/hold-commits`` exists, a node started with ``fault_injection``
holds its commit index (it applies nothing)."""


@dataclass(frozen=True, slots=True)
class WatchdogLimits:
    election_ms: int
    """One election timeout (the longest: ``election_max_ms``)."""
    health_elections: int
    """Election timeouts of a stalled apply before health reports NOT_SERVING."""
    exit_elections: int
    """Election timeouts of a stalled apply before the node exits (`EXIT_STALLED`)."""


class ApplyWatchdog:
    """Watches ``(last_applied, commit)`` pairs over time (monotonic seconds)."""

    def __init__(self, address: str, limits: WatchdogLimits, die: Die = die) -> None:
        self._address = address
        self._limits = limits
        self._die = die
        self._applied = -1
        self._commit = 0
        """The commit index when the applied index last moved."""
        self._since_s = 0.0
        self._stalled = False

    def check(self, last_applied: int, commit: int, now_s: float) -> str | None:
        """Why this node must not serve (None: it applies, or has nothing to apply); exits
        once the stall has lasted ``exit_elections`` election timeouts."""
        if last_applied != self._applied or commit <= last_applied:
            if self._stalled:
                log.info("event=apply_resumed last_applied=%d commit_index=%d", last_applied,
                         commit)
            self._applied, self._commit, self._since_s = last_applied, commit, now_s
            self._stalled = False
            return None
        stalled_ms = int((now_s - self._since_s) * 1000)
        limits = self._limits
        if commit <= self._commit or stalled_ms < limits.health_elections * limits.election_ms:
            return None
        reason = (f"apply_stalled last_applied={last_applied} commit_index={commit} "
                  f"stalled_ms={stalled_ms}")
        if not self._stalled:
            self._stalled = True
            log.error("event=apply_stalled last_applied=%d commit_index=%d stalled_ms=%d: the "
                      "applied index stands still while the commit index moves; health is "
                      "NOT_SERVING, and the node exits after %d election timeouts",
                      last_applied, commit, stalled_ms, limits.exit_elections)
        if stalled_ms >= limits.exit_elections * limits.election_ms:
            self._die(self._address, reason, EXIT_STALLED)
        return reason
