"""The injected wall clock. Nothing in tickwheel reads the time of day any other way.

Intervals (leases, timeouts, linger) use `time.monotonic`, which is not the time of day and
cannot be skewed; what a message's due time is compared with comes from a `Clock`.
"""

from __future__ import annotations

import threading
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


class FakeClock:
    """A clock tests move by hand (thread-safe); like trio's ``MockClock`` it never goes back."""

    def __init__(self, start_ms: int) -> None:
        self._now_ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def advance(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise ValueError(f"a clock never goes back (delta_ms={delta_ms})")
        with self._lock:
            self._now_ms += delta_ms
