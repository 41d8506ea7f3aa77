"""Helpers the node tests share (importable: ``tests/node`` is on pytest's path)."""

from __future__ import annotations

import time
import uuid


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def topic(prefix: str = "t") -> str:
    """A fresh topic per test, so tests sharing a cluster do not see each other's messages."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
