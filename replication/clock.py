"""The injected wall clock. Nothing in tickwheel reads the time of day any other way.

Intervals (leases, timeouts, linger) use `time.monotonic`, which is not the time of day and
cannot be skewed; what a message's due time is compared with comes from a `Clock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Unix time in milliseconds."""
        ...


class SystemClock:
    """The machine's clock, offset by ``skew_ms`` (only ever non-zero for fault injection)."""

    def __init__(self, skew_ms: int = 0) -> None:
        self.skew_ms = skew_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.skew_ms
