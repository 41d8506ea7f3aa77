"""The `Courier` on its own, against a replica stand-in: the orderings between the Raft thread
and the loop that a cluster reaches only by chance."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from nodetests import RecordingReplica

from tickwheel.common.errors import ConsumerStalled, NotLeader, Overloaded
from tickwheel.node.delivery.courier import Courier, CourierConfig
from tickwheel.node.delivery.levels import DEFAULT_LEVELS, RetryPolicy, parse_levels
from tickwheel.node.delivery.retries import WINDOW_BYTES, Retries
from tickwheel.node.delivery.sessions import Session
from tickwheel.node.ops.metrics import Metrics
from tickwheel.replication import Delivery, Expired, LeaseRef, Retried
from tickwheel.wheel import Cursor, DueMessage


class LosingReplica:
    """Leads until the command creating a group commits; in that same turn of the Raft
    thread the leadership ends (the commit's answer reaches the loop first, the end right
    after, both before the awaiting coroutine runs again)."""

    shard = 0

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
                          lambda: 0, None, Metrics())
        replica.courier = courier
        courier.attach(replica)  # type: ignore[arg-type]
        with pytest.raises(NotLeader):
            await courier.subscribe("orders", "billing", "c1", 10, 30_000)
        await asyncio.sleep(0)  # anything the Raft thread queued has run
        assert courier.consumers_of("orders", "billing") == 0

    asyncio.run(subscribe())
    assert replica.joined == []


def test_a_stream_that_was_never_written_its_messages_is_closed_and_nothing_is_retried(
        tmp_path: Path) -> None:
    """A stream that does not read holds a whole budget of leases when its first runs out:
    retrying them put a copy of every body through Raft at once (200 MiB: 1.3 GB on the
    leader, and an election lost under the burst). They are released with the stream
    instead (`Replica.leave`). A stream that was written its messages is retried as ever."""
    replica = RecordingReplica()
    due = [DueMessage(f"m{i}", "orders", b"x", {}, 0, handle=i, slot_second=0, local_index=i)
           for i in range(4)]

    async def run() -> tuple[Session, Session]:
        courier = Courier(CourierConfig(max_batch_msgs=2),
                          RetryPolicy(parse_levels(DEFAULT_LEVELS)), lambda: 0,
                          None, Metrics())
        courier.attach(replica)  # type: ignore[arg-type]
        courier.dispatch_started(1, 1, Cursor(0, 0), 0)
        await asyncio.sleep(0)
        reader = await courier.subscribe("orders", "readers", "reads", 10, 100)
        hoarder = await courier.subscribe("orders", "hoarders", "never-reads", 10, 100)
        leases = [LeaseRef(1 + (i >= 2), i, 1, 9) for i in range(4)]
        courier.deliver([Delivery(message, consumer.key, lease, False, 1)
                         for message, lease, consumer in zip(
                             due, leases, [reader, reader, hoarder, hoarder], strict=True)])
        await asyncio.sleep(0)
        reader.writing = await reader.next_batch()
        reader.written()  # as its stream does once gRPC took the response
        hoarder.writing = await hoarder.next_batch()  # and its response is never written
        courier.expired([Expired(message, lease, consumer.group, 1, consumer.key)
                         for message, lease, consumer in zip(
                             due, leases, [reader, reader, hoarder, hoarder], strict=True)])
        await asyncio.sleep(0)
        return reader, hoarder

    reader, hoarder = asyncio.run(run())
    assert [copy.id for _, copy in replica.retried] == ["m0", "m1"]
    assert replica.left == [hoarder.key]
    assert isinstance(hoarder.closed, ConsumerStalled) and reader.closed is None
    assert hoarder.writing == [] and not hoarder.unacked  # it pins no body any more


def test_retry_copies_go_to_raft_a_window_of_bodies_at_a_time() -> None:
    """A consumer that reads and never acks has its whole budget run out at once; proposed
    together, its copies took the leader up by four times their bodies on their way through
    Raft. Each batch waits for the one before to be answered, once the window is full."""

    class Committing(RecordingReplica):
        def __init__(self) -> None:
            super().__init__()
            self.futures: list[tuple[Future, int]] = []

        def retry(self, copies: list[object]) -> Future:
            super().retry(copies)
            self.futures.append((Future(), len(copies)))
            return self.futures[-1][0]

    replica = Committing()
    body = b"x" * (WINDOW_BYTES // 2)
    items = [(DueMessage(f"m{i}", "orders", body, {}, 0, handle=i, slot_second=0,
                         local_index=i), LeaseRef(1, i, 1, 9), "", 1) for i in range(5)]

    async def run() -> list[int]:
        retries = Retries(RetryPolicy(parse_levels(DEFAULT_LEVELS)), lambda: 0, Metrics(),
                          asyncio.get_running_loop(), lambda: replica)  # type: ignore[arg-type]
        retries.propose(items, "visibility_timeout")
        proposed = [len(replica.retried)]  # the first window: two bodies
        for answered in range(3):
            future, count = replica.futures[answered]
            future.set_result([Retried(None, 1)] * count)
            await asyncio.sleep(0)  # the answer reaches the loop
            proposed.append(len(replica.retried))
        return proposed

    assert asyncio.run(run()) == [2, 4, 5, 5]


def test_retry_copies_refused_as_overloaded_are_proposed_again() -> None:
    """Expired leases are offered to the courier once; a retry the replica refused because
    its queue was full (`Overloaded`) was dropped, and its messages stayed leased and
    expired, retried by nobody, for as long as this node led. The refused batch is proposed
    again a little later."""

    class Full(RecordingReplica):
        def __init__(self) -> None:
            super().__init__()
            self.refusals = 1
            self.answered = asyncio.Event()

        def retry(self, copies: list[object]) -> Future:
            if self.refusals:
                self.refusals -= 1
                raise Overloaded("max_queued_msgs")
            future = super().retry(copies)
            if len(self.retried) == 2:
                self.answered.set()
            return future

    replica = Full()
    items = [(DueMessage(f"m{i}", "orders", b"x", {}, 0, handle=i, slot_second=0,
                         local_index=i), LeaseRef(1, i, 1, 9), "", 1)
             for i in range(2)]

    async def run() -> None:
        retries = Retries(RetryPolicy(parse_levels(DEFAULT_LEVELS)), lambda: 0, Metrics(),
                          asyncio.get_running_loop(), lambda: replica)  # type: ignore[arg-type]
        retries.propose(items, "visibility_timeout")
        assert replica.retried == []
        await asyncio.wait_for(replica.answered.wait(), 10)

    asyncio.run(run())
    assert [lease.handle for lease, _ in replica.retried] == [0, 1]  # type: ignore[misc]


class LeadingReplica:
    """Leads, holds its lease, creates every group at once, and records send reports."""

    shard = 0

    def __init__(self) -> None:
        self.reports: list[tuple[int, int]] = []

    def is_leader(self) -> bool:
        return True

    def leader_hint(self) -> str | None:
        return None

    def may_deliver(self) -> bool:
        return True

    def ensure_group(self, topic: str, name: str) -> Future:
        created: Future = Future()
        created.set_result(True)
        return created

    def join(self, slot: object) -> None:
        pass

    def sent(self, key: int, leases: list[LeaseRef], sent_ms: int) -> None:
        self.reports.append((len(leases), sent_ms))


def test_messages_granted_ahead_go_out_together_when_the_last_of_a_few_ms_is_due(
        tmp_path: Path) -> None:
    """One send for the messages of a hand-out due within `max_hold_ms` of each other (one
    response, one ack and one credit back instead of one each per due millisecond), never
    before a message is due; one due later goes on its own at its time."""
    replica = LeadingReplica()

    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    async def deliver() -> list[list[object]]:
        courier = Courier(CourierConfig(max_hold_ms=4), RetryPolicy(parse_levels(DEFAULT_LEVELS)),
                          now_ms, None, Metrics())
        courier.attach(replica)  # type: ignore[arg-type]
        courier.dispatch_started(1, 1, Cursor(0, 0), 0)
        await asyncio.sleep(0)
        consumer = await courier.subscribe("orders", "billing", "c1", 10, 30_000)
        first_ms = now_ms() + 200
        dues = [first_ms, first_ms + 1, first_ms + 3, first_ms + 40]
        courier.deliver([
            Delivery(DueMessage(f"m{i}", "orders", b"x", {}, due_ms, i, due_ms // 1000, i),
                     consumer.key, LeaseRef(1, i, 1, 7), False, 1)
            for i, due_ms in enumerate(dues)])
        return [await asyncio.wait_for(consumer.next_batch(), 5) for _ in range(2)]

    batches = asyncio.run(deliver())
    assert [[sent.delivery.message.id for sent in batch] for batch in batches] == [
        ["m0", "m1", "m2"], ["m3"]]
    for batch in batches:
        for sent in batch:
            assert sent.delivered_at_ms >= sent.delivery.message.deliver_at_ms
    assert [count for count, _ in replica.reports] == [3, 1]


def test_a_consumer_that_holds_gets_a_hand_out_at_once_with_the_wait_of_each_message(
        tmp_path: Path) -> None:
    """To a consumer that subscribed with ``hold`` the same hand-out goes in one send as soon
    as it is granted, each message with its hold: the time left until its window's send
    (the same windows as above), and ``delivered_at_ms`` the end of that hold."""
    replica = LeadingReplica()

    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    async def deliver() -> tuple[int, list[object], int]:
        courier = Courier(CourierConfig(max_hold_ms=4), RetryPolicy(parse_levels(DEFAULT_LEVELS)),
                          now_ms, None, Metrics())
        courier.attach(replica)  # type: ignore[arg-type]
        courier.dispatch_started(1, 1, Cursor(0, 0), 0)
        await asyncio.sleep(0)
        consumer = await courier.subscribe("orders", "billing", "c1", 10, 30_000, hold=True)
        first_ms = now_ms() + 200
        dues = [first_ms + 40, first_ms, first_ms + 1, first_ms + 3, first_ms - 300]
        courier.deliver([
            Delivery(DueMessage(f"m{i}", "orders", b"x", {}, due_ms, i, due_ms // 1000, i),
                     consumer.key, LeaseRef(1, i, 1, 7), False, 1)
            for i, due_ms in enumerate(dues)])
        batch = await asyncio.wait_for(consumer.next_batch(), 5)
        return first_ms, batch, consumer.outbox.qsize()

    first_ms, batch, left = asyncio.run(deliver())
    assert left == 0
    assert [sent.delivery.message.id for sent in batch] == ["m4", "m1", "m2", "m3", "m0"]
    sent_ms = {sent.delivered_at_ms - sent.hold_ms for sent in batch}
    assert len(sent_ms) == 1 and sent_ms.pop() < first_ms  # one send, long before any was due
    assert [sent.delivered_at_ms for sent in batch][1:] == [first_ms + 3] * 3 + [first_ms + 40]
    assert batch[0].hold_ms == 0  # already due: at once
    assert all(sent.hold_ms > 0 for sent in batch[1:])
    assert [count for count, _ in replica.reports] == [5]
