"""Helpers the node tests share (importable: ``tests/node`` is on pytest's path)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future

from tickwheel.replication import LeaseRef


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def topic(prefix: str = "t") -> str:
    """A fresh topic per test, so tests sharing a cluster do not see each other's messages."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class RecordingReplica:
    """Leads, commits every group at once, and records what the courier asks of it."""

    shard = 0

    def __init__(self) -> None:
        self.retried: list[object] = []
        self.left: list[int] = []

    def is_leader(self) -> bool:
        return True

    def leader_hint(self) -> str | None:
        return None

    def ensure_group(self, topic: str, name: str) -> Future:
        committed: Future = Future()
        committed.set_result(True)
        return committed

    def join(self, slot: object) -> None:
        pass

    def may_deliver(self) -> bool:
        return True

    def sent(self, key: int, leases: list[LeaseRef], sent_ms: int) -> None:
        pass

    def retry(self, copies: list[object]) -> Future:
        self.retried += copies
        return Future()  # not committed within the test

    def leave(self, key: int) -> None:
        self.left.append(key)
