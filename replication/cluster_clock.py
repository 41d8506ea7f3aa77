"""The cluster's time: what a leader stamps, dispatches and sends by.

A leader with a fast clock handed messages out early by its error, one with a slow clock late
by its error. So while it leads, a node reads the time as the time a *majority* of members'
clocks has reached, as it estimates them: its own clock, and each peer's from that peer's
latest answer (`tickwheel.replication.raft.clocks`), taken at its lower bound. Sorted from the
highest, the members' lower bounds give the cluster's time at place ``majority``: a majority
of members read at least that much.

- **Early by at most the majority's error.** Every bound is at most the member's true reading,
  so the cluster's time is at most what a majority of clocks read: if a majority of clocks is
  at most ``e`` ahead of the true time, nothing is dispatched more than ``e`` early, whatever
  the other clocks say (one of three far ahead changes nothing).
- **Late by at most the majority's error and a round trip.** A bound is below its member's
  reading by at most the round trip of the answer it came from.
- **No majority, no agreement.** Estimates older than ``max_age_ms`` are not used; with fewer
  than a majority of fresh ones (the leader counting itself) `agreed` is False and the leader
  dispatches nothing (its tenure needs a majority of recent answers anyway), and `now_ms` reads
  the lowest of its own clock and every bound it has, so stamps never run ahead.
- A node that does not lead, and a cluster of one, read their own clock.

`observe` gives each member's offset from this node's clock and logs a leader whose own clock
is the odd one (``event=clock_outlier``, again after ``OUTLIER_LOG_S`` or when the offset
moves by more than ``OUTLIER_MS``). Any thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tickwheel.common.clock import Clock
from tickwheel.replication.raft import RaftPort

log = logging.getLogger("tickwheel.replication")

OUTLIER_MS = 100
"""How far (beyond the round trip) a leader's own clock may be from the cluster's time before
it says so."""
OUTLIER_LOG_S = 10.0


@dataclass(frozen=True, slots=True)
class MemberOffset:
    """A member's clock minus this node's: at least ``offset_ms``, at most ``error_ms``
    more."""

    offset_ms: int
    error_ms: int


class ClusterClock:
    """A `Clock` that reads the cluster's time while this node leads (module docstring)."""

    def __init__(self, address: str, local: Clock, raft: RaftPort, members: int,
                 max_age_ms: int) -> None:
        self._address = address
        self.local = local
        """This node's own clock."""
        self._raft = raft
        self._majority = members // 2 + 1
        self._members = members
        self._max_age_s = max_age_ms / 1000
        self._outlier_logged: tuple[float, int] = (-OUTLIER_LOG_S, 0)
        """When the last ``clock_outlier`` was logged, and the offset it said."""

    def monotonic_s(self) -> float:
        return self.local.monotonic_s()

    def now_ms(self) -> int:
        own_ms = self.local.now_ms()
        if self._members == 1 or not self._raft.is_leader():
            return own_ms
        agreed_ms, lowest_ms = self._read(own_ms)
        return agreed_ms if agreed_ms is not None else lowest_ms

    def agreed(self) -> bool:
        """Whether a majority's clocks are known fresh (always, alone)."""
        return self._members == 1 or self._read(self.local.now_ms())[0] is not None

    def observe(self) -> dict[str, MemberOffset]:
        """On the leader, every member's offset from this node's clock, by Raft address (none
        for a member with no estimate); logs this node's clock if it is the odd one."""
        if self._members == 1 or not self._raft.is_leader():
            return {}
        own_ms, now_s = self.local.now_ms(), self.local.monotonic_s()
        offsets = {self._address: MemberOffset(0, 0)}
        for peer, clock in self._raft.peer_clocks().items():
            offsets[peer] = MemberOffset(int(clock.base_ms + now_s * 1000 - own_ms),
                                         round(clock.error_ms))
        agreed_ms, _ = self._read(own_ms)
        if agreed_ms is not None:
            error_ms = max(offset.error_ms for offset in offsets.values())
            off_ms = own_ms - agreed_ms
            logged_s, logged_ms = self._outlier_logged
            if abs(off_ms) > OUTLIER_MS + error_ms and (
                    now_s - logged_s >= OUTLIER_LOG_S or abs(off_ms - logged_ms) > OUTLIER_MS):
                self._outlier_logged = (now_s, off_ms)
                log.warning("event=clock_outlier offset_ms=%d error_ms=%d this leader's clock "
                            "is %d ms from the time a majority of members' clocks reached: "
                            "it dispatches by the majority's", off_ms, error_ms, off_ms)
        return offsets

    def _read(self, own_ms: int) -> tuple[int | None, int]:
        """(the time a majority reached by fresh estimates, or None; the lowest bound)."""
        now_s = self.local.monotonic_s()
        fresh, lowest_ms = [float(own_ms)], float(own_ms)
        for clock in self._raft.peer_clocks().values():
            bound_ms = clock.base_ms + now_s * 1000
            lowest_ms = min(lowest_ms, bound_ms)
            if now_s - clock.heard_s <= self._max_age_s:
                fresh.append(bound_ms)
        if len(fresh) < self._majority:
            return None, int(lowest_ms)
        fresh.sort(reverse=True)
        return int(fresh[self._majority - 1]), int(lowest_ms)
