"""The injected clock. Nothing in the replica reads the time any other way, so a simulation can
drive it (`tickwheel.replication.Replica` takes one).

Two readings: the time of day (``now_ms``), which due times are compared with and which may be
skewed between nodes; and a monotonic one (``monotonic_s``) for intervals (leases, timeouts,
pacing), which is not the time of day and cannot be skewed. The Raft port's tenure
(`RaftPort.tenure_until_s`) is on the same monotonic scale.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Unix time in milliseconds."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back (``time.monotonic``'s scale)."""
        ...


class SystemClock:
    """The machine's clock, offset by ``skew_ms`` (only ever non-zero for fault injection)."""

    def __init__(self, skew_ms: int = 0) -> None:
        self.skew_ms = skew_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.skew_ms

    def monotonic_s(self) -> float:
        return time.monotonic()
