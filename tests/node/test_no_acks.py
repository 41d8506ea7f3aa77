"""A consumer stream that reads and never acknowledges is closed after
``max_unacked_timeouts`` of its messages ran out their visibility timeout, and its messages
go to the group's other consumers (`tickwheel.node.delivery.no_acks`): the courier against a
replica stand-in for the exact count, then a real cluster end to end."""

from __future__ import annotations

import asyncio
import re
import threading
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest
from nodetests import RecordingReplica, now_ms, topic

from tickwheel.client import Message, Received, TickwheelClientError
from tickwheel.common.errors import ConsumerNotAcking
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.node.delivery.courier import Courier, CourierConfig
from tickwheel.node.delivery.levels import DEFAULT_LEVELS, RetryPolicy, parse_levels
from tickwheel.node.delivery.sessions import Session
from tickwheel.node.ops.metrics import Metrics
from tickwheel.replication import Delivery, Expired, LeaseRef
from tickwheel.wheel import Cursor, DueMessage


class StandIn(RecordingReplica):
    """A `RecordingReplica` that knows no group by id (a receipt no longer sent to the stream
    is decoded and goes on) and records acks too."""

    def __init__(self) -> None:
        super().__init__()
        self.acked: list[LeaseRef] = []

    def groups(self) -> StandIn:
        return self

    def by_id(self, group_id: int) -> None:
        return None

    def ack(self, leases: list[LeaseRef], wake: bool) -> Future:
        self.acked += leases
        return Future()  # not committed within the test

    def give_back(self, leases: list[LeaseRef]) -> None:
        pass


def test_a_stream_that_acked_nothing_is_closed_at_the_bound_and_one_that_acked_never_is(
        ) -> None:
    """Bound 3. The never-acking stream's first two timeouts are retried as ever and it stays
    open; its third closes it (`ConsumerNotAcking`) and releases its leases, that one's
    included, with nothing retried and nothing left to send it. A stream that acked once, and
    one whose only ack came after its lease ran out, are never closed."""
    replica = StandIn()
    handles = iter(range(1_000))

    async def run() -> dict[str, Session]:
        courier = Courier(CourierConfig(max_unacked_timeouts=3),
                          RetryPolicy(parse_levels(DEFAULT_LEVELS)), lambda: 0, None,
                          Metrics())
        courier.attach(replica)  # type: ignore[arg-type]
        courier.dispatch_started(1, 1, Cursor(0, 0), 0)
        await asyncio.sleep(0)
        streams = {name: await courier.subscribe("orders", "g", name, 100, 1_000)
                   for name in ("never", "acks", "late")}

        async def send(name: str, count: int) -> list[Expired]:
            """``count`` messages to the stream, written to it; their leases, run out."""
            stream = streams[name]
            due = [(DueMessage(f"{name}-{h}", "orders", b"x", {}, 0, handle=h, slot_second=0,
                               local_index=h), LeaseRef(1, h, 1, 9))
                   for h in (next(handles) for _ in range(count))]
            courier.deliver([Delivery(message, stream.key, lease, False, 1)
                             for message, lease in due])
            await asyncio.sleep(0)
            stream.writing = await stream.next_batch()
            stream.written()
            return [Expired(message, lease, "g", 1, stream.key) for message, lease in due]

        expired = await send("never", 2) + await send("acks", 2) + await send("late", 1)
        acked = next(iter(streams["acks"].unacked.values()))
        courier.acknowledge(streams["acks"], [acked.receipt])
        late = next(iter(streams["late"].unacked.values()))
        courier.expired([e for e in expired if e.message.id != acked.delivery.message.id])
        await asyncio.sleep(0)
        courier.acknowledge(streams["late"], [late.receipt])  # its lease ran out already
        assert streams["never"].closed is None and replica.left == []
        assert len(replica.retried) == 2 + 1 + 1  # never's two, acks' other, late's one

        expired = await send("never", 2) + await send("acks", 3) + await send("late", 3)
        queued = DueMessage("never-queued", "orders", b"x", {}, 0, handle=999, slot_second=0,
                            local_index=999)
        courier.deliver([Delivery(queued, streams["never"].key, LeaseRef(1, 999, 1, 9), False,
                                  1)])  # sent to it, not yet written: dropped with the close
        await asyncio.sleep(0)
        courier.expired(expired)
        await asyncio.sleep(0)
        return streams

    streams = asyncio.run(run())
    never = streams["never"]
    assert isinstance(never.closed, ConsumerNotAcking)
    assert str(never.closed).startswith("ack: consumer 'never' acknowledged none of its")
    assert replica.left == [never.key]
    retried = [copy.id for _, copy in replica.retried]  # type: ignore[attr-defined]
    assert sorted(i for i in retried if i.startswith("never")) == ["never-0", "never-1"]
    assert len(retried) == 4 + 3 + 3  # the stream that acked and the late one: all retried
    assert streams["acks"].closed is None and streams["late"].closed is None
    assert never.outbox.qsize() == 1 and not never.unacked  # only the end of the stream


def test_bound_zero_closes_nothing() -> None:
    replica = StandIn()

    async def run() -> Session:
        courier = Courier(CourierConfig(max_unacked_timeouts=0),
                          RetryPolicy(parse_levels(DEFAULT_LEVELS)), lambda: 0, None,
                          Metrics())
        courier.attach(replica)  # type: ignore[arg-type]
        courier.dispatch_started(1, 1, Cursor(0, 0), 0)
        await asyncio.sleep(0)
        stream = await courier.subscribe("orders", "g", "never", 100, 1_000)
        due = [DueMessage(f"m{h}", "orders", b"x", {}, 0, handle=h, slot_second=0,
                          local_index=h) for h in range(20)]
        leases = [LeaseRef(1, h, 1, 9) for h in range(20)]
        courier.deliver([Delivery(m, stream.key, lease, False, 1)
                         for m, lease in zip(due, leases, strict=True)])
        await asyncio.sleep(0)
        stream.writing = await stream.next_batch()
        stream.written()
        courier.expired([Expired(m, lease, "g", 1, stream.key)
                         for m, lease in zip(due, leases, strict=True)])
        await asyncio.sleep(0)
        return stream

    stream = asyncio.run(run())
    assert stream.closed is None and len(replica.retried) == 20


LADDER = ("--delay-levels", "1s 2s 3s", "--retry-start-level", "1", "--max-attempts", "2")
"""A retry after a visibility timeout waits a second; the second attempt is the last, so a
message that ran out twice would be dead-lettered."""
VISIBILITY_MS = 1_500
COUNT = 6


@pytest.mark.cluster
def test_a_consumer_that_never_acks_is_closed_and_its_messages_go_to_the_healthy_one(
        tmp_path: Path) -> None:
    """A library consumer that takes messages and never acks them (the application forgot
    ``message.ack()``) and a healthy one in the same group. Once the visibility timeout of
    its messages runs out (``max_unacked_timeouts`` 3, the default, of its 6), the leader
    closes its stream with ``FAILED_PRECONDITION`` and its messages go to the healthy one at
    once, each exactly once, as attempt 2 flagged ``possible_duplicate`` (released with the
    stream); none is dead-lettered, though a second run-out would have been the last. On the
    code before, the stream stayed open and each message was retried on the ladder."""
    name, group = topic("noack"), "workers"
    with LocalCluster(tmp_path, extra_args=LADDER) as cluster, \
            cluster.client(timeout_s=60) as client:
        leader = cluster.leader()
        broken = client.consume(name, group=group, name="forgets-acks", prefetch=8,
                                visibility_timeout_ms=VISIBILITY_MS)
        taken: list[Received] = []
        ended: list[BaseException] = []

        def forget_acks() -> None:
            try:
                for message in broken:
                    taken.append(message)
            except TickwheelClientError as error:
                ended.append(error)

        reader = threading.Thread(target=forget_acks, daemon=True)
        reader.start()
        wait_for(lambda: any(g.group == group and g.consumers for g in
                             client.cluster_info().groups), 20, "the broken consumer's group")
        ids = {f"m-{i}" for i in range(COUNT)}
        client.schedule_many([Message(name, b"x", delay_ms=0, id=i) for i in sorted(ids)])
        wait_for(lambda: len(taken) == COUNT or None, 20, "the broken consumer's messages")
        assert {(m.id, m.attempt, m.possible_duplicate) for m in taken} == {
            (i, 1, False) for i in ids}

        got: list[Received] = []
        with client.consume(name, group=group, name="healthy", prefetch=16,
                            visibility_timeout_ms=60_000) as healthy:
            timer = threading.Timer(30, healthy.close)
            timer.start()
            marker_due_ms = None
            for message in healthy:
                message.ack()
                if message.id == "marker":
                    break
                got.append(message)
                if {m.id for m in got} == ids and marker_due_ms is None:
                    # a ladder retry of any of them would be due within a step of now
                    marker_due_ms = now_ms() + 2_000
                    client.schedule(name, b"m", deliver_at_ms=marker_due_ms, id="marker")
            timer.cancel()
        reader.join(10)
        broken.close()
        log = leader.log_path.read_text()

    assert len(ended) == 1, "the broken consumer's stream was never closed"
    error = ended[0]
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details.startswith("ack: consumer 'forgets-acks' acknowledged none of its "
                                    "messages, and the visibility timeout (1500 ms) of ")
    assert re.search(r"event=consumer_closed reason=no_acks topic=\S+ group='workers' "
                     r"consumer='forgets-acks' timeouts=\d+ unacked=\d+ "
                     r"visibility_timeout_ms=1500 max_unacked_timeouts=3", log)
    # Timeouts below the bound are retried on the ladder as ever (a copy: attempt 2, not
    # flagged); the one that reaches it releases the stream's leases (attempt 2, flagged).
    retried = set(re.findall(r"event=message_retried reason=visibility_timeout id='([^']+)'",
                             log))
    assert len(retried) <= 2
    assert sorted((m.id, m.attempt, m.possible_duplicate) for m in got) == sorted(
        (i, 2, i not in retried) for i in ids)
    assert "to_topic=%DLQ%" not in log
