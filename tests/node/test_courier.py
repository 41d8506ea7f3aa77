"""The `Courier` on its own, against a replica stand-in: the orderings between the Raft thread
and the loop that a cluster reaches only by chance."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path

import pytest

from tickwheel.common.errors import NotLeader
from tickwheel.node.delivery import Courier, CourierConfig
from tickwheel.node.journal import DeliveryJournal
from tickwheel.node.levels import DEFAULT_LEVELS, RetryPolicy, parse_levels
from tickwheel.node.metrics import Metrics


class LosingReplica:
    """Leads until the command creating a group commits; in that same turn of the Raft
    thread the leadership ends (the commit's answer reaches the loop first, the end right
    after, both before the awaiting coroutine runs again)."""

    def __init__(self) -> None:
        self.courier: Courier | None = None
        self.leading = True
        self.joined: list[object] = []

    def is_leader(self) -> bool:
        return self.leading

    def leader_hint(self) -> str | None:
        return None

    def ensure_group(self, topic: str, name: str) -> Future:
        committed: Future = Future()

        def raft_thread_turn() -> None:
            # as the Raft thread does it, in one turn, once the courier awaits the commit
            committed.set_result(True)  # the answer is queued to the loop...
            self.leading = False
            assert self.courier is not None
            self.courier.dispatch_stopped(1)  # ... and the end of leadership right after

        asyncio.get_running_loop().call_soon(raft_thread_turn)
        return committed

    def join(self, slot: object) -> None:
        self.joined.append(slot)


def test_a_consumer_whose_group_commits_as_leadership_ends_is_sent_to_the_next_leader(
        tmp_path: Path) -> None:
    """A consumer joined after the courier closed the leader's consumers stayed joined to a
    node that no longer led: its stream open, nothing ever sent on it."""
    replica = LosingReplica()

    async def subscribe() -> None:
        courier = Courier(CourierConfig(), RetryPolicy(parse_levels(DEFAULT_LEVELS)),
                          lambda: 0, DeliveryJournal(tmp_path / "journal", "n0", 0), Metrics())
        replica.courier = courier
        courier.attach(replica)  # type: ignore[arg-type]
        with pytest.raises(NotLeader):
            await courier.subscribe("orders", "billing", "c1", 10, 30_000)
        await asyncio.sleep(0)  # anything the Raft thread queued has run
        assert courier.consumers_of("orders", "billing") == 0

    asyncio.run(subscribe())
    assert replica.joined == []
