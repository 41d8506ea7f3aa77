"""A cluster of two shards (two Raft groups of three real node processes each), used as a
user would through the client library: every message on the shard its id (or routing key)
hashes to, handles and receipts that go back to their shard, one consumer that gets every
shard's messages, and one shard's leader killed while the other shard goes on delivering."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator

import grpc
import pytest

from tickwheel.client import (
    AsyncClient,
    CancelOutcome,
    Client,
    Message,
    Received,
    RescheduleOutcome,
)
from tickwheel.client.shards import handle_shard, receipt_shard, shard_of
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

SHARDS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("shards"), 3, shards=SHARDS,
                      metrics=True) as started:
        started.leaders(timeout_s=60)  # six fresh processes, while another worker runs
        started.placed()  # so that no hand-over stalls a shard in the middle of a test
        yield started



def test_every_node_serves_the_map_of_every_shard(cluster: LocalCluster) -> None:
    for node in cluster.nodes:
        info = node.info(timeout_s=5)
        assert info is not None
        assert info.shard == node.shard
        assert [list(s.grpc_addresses) for s in info.shards] == [
            [n.grpc_address for n in members] for members in cluster.shards]
        own = info.shards[node.shard]
        assert own.leader_grpc == cluster.leader(shard=node.shard).grpc_address


def test_status_shows_every_shard_and_metrics_name_the_shard(cluster: LocalCluster) -> None:
    assert cluster.security is not None
    target = cluster.nodes[-1].grpc_address  # any node: it knows the others
    status = subprocess.run(
        [sys.executable, "-m", "tickwheel.node", "status", "--target", target],
        check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, **cluster.security.environment(), "COLUMNS": "200"})
    assert status.returncode == 0, status.stdout + status.stderr
    for shard in range(SHARDS):
        assert f"shard {shard} of {SHARDS} (map version 1): term" in status.stdout
        assert f"leader {cluster.leader(shard=shard).grpc_address}" in status.stdout
    for node in cluster.nodes:
        assert node.metrics_address is not None
        with urllib.request.urlopen(f"http://{node.metrics_address}/metrics",
                                    timeout=10) as page:
            assert f'target_info{{shard="{node.shard}"}} 1.0' in page.read().decode()


def test_each_message_lives_on_the_shard_of_its_id_and_one_consumer_gets_them_all(
        cluster: LocalCluster, client: Client) -> None:
    topic = f"spread-{uuid.uuid4().hex[:8]}"
    far_ms = int(time.time() * 1000) + 3_600_000  # due once counted, by a reschedule
    messages = [Message(topic, f"body-{n}", deliver_at_ms=far_ms, id=f"{topic}-{n}")
                for n in range(200)]
    results = client.schedule_many(messages)
    assert [r.id for r in results] == [m.id for m in messages]  # answered in the request's order
    expected = [shard_of(m.id, SHARDS) for m in messages]
    assert [handle_shard(r.handle) for r in results] == expected
    assert 60 <= expected.count(0) <= 140  # both shards hold a fair part
    for shard in range(SHARDS):  # what each shard's Raft group holds: its part alone
        info = cluster.leader(shard=shard).info(timeout_s=5)
        assert info is not None
        assert {p.topic: p.pending for p in info.pending}.get(topic) == expected.count(shard)
    # a retry of the same ids is answered as a duplicate, by the shard that holds each
    again = client.schedule_many(messages)
    assert all(r.duplicate for r in again)
    assert [r.handle for r in again] == [r.handle for r in results]
    assert {m.outcome for m in client.reschedule([r.handle for r in results], delay_ms=0)} == {
        RescheduleOutcome.RESCHEDULED}

    got: dict[str, Received] = {}
    with client.consume(topic, prefetch=32) as consumer:
        for message in consumer:
            assert message.id not in got, f"{message.id} delivered twice"
            got[message.id] = message
            assert receipt_shard(message.receipt) == shard_of(message.id, SHARDS)
            message.ack()
            if len(got) == len(messages):
                break
    assert sorted(got) == sorted(m.id for m in messages)
    assert not any(m.possible_duplicate for m in got.values())


def test_a_routing_key_keeps_messages_together(client: Client) -> None:
    topic = f"keyed-{uuid.uuid4().hex[:8]}"
    far_ms = int(time.time() * 1000) + 3_600_000
    for key in ("customer-1", "customer-2", "customer-3"):
        results = client.schedule_many([Message(topic, "x", deliver_at_ms=far_ms,
                                                routing_key=key) for _ in range(20)])
        assert {handle_shard(r.handle) for r in results} == {shard_of(key, SHARDS)}
        assert client.cancel_many([r.handle for r in results]) == [True] * 20


def test_cancel_reschedule_and_acks_reach_the_shard_that_gave_out_the_handle(
        client: Client) -> None:
    topic = f"settle-{uuid.uuid4().hex[:8]}"
    far_ms = int(time.time() * 1000) + 3_600_000
    results = client.schedule_many([Message(topic, "x", deliver_at_ms=far_ms)
                                    for _ in range(40)])
    handles, ids = [r.handle for r in results], [r.id for r in results]
    assert {handle_shard(h) for h in handles} == {0, 1}
    moved = client.reschedule(handles[:20], delay_ms=0)
    assert all(m.deliver_at_ms > 0 for m in moved)
    assert client.cancel_outcomes(handles[20:]) == [CancelOutcome.CANCELLED] * 20
    assert client.cancel_outcomes(handles[20:]) == [CancelOutcome.ALREADY_CANCELLED] * 20
    received: list[Received] = []
    deadline = time.monotonic() + 30
    while len(received) < 20 and time.monotonic() < deadline:
        received += client.receive(topic, consumer="c1", max_messages=20, wait_ms=2_000)
    assert sorted(m.id for m in received) == sorted(ids[:20])
    assert {receipt_shard(m.receipt) for m in received} == {0, 1}
    assert client.ack_receipts(topic, "", [m.receipt for m in received]) == [True] * 20


def test_a_node_refuses_a_message_or_handle_of_another_shard(cluster: LocalCluster,
                                                             client: Client) -> None:
    stranger = next(f"stray-{n}" for n in range(100) if shard_of(f"stray-{n}", SHARDS) == 1)
    leader = cluster.leader(shard=0)
    with pytest.raises(grpc.RpcError) as refused:
        leader.stub.Schedule(pb.ScheduleRequest(messages=[pb.Message(
            id=stranger, topic="orders", body=b"x", delay_ms=1_000)]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "messages[0].id" in refused.value.details() and "shard 1" in refused.value.details()
    far_ms = int(time.time() * 1000) + 3_600_000
    handle = client.schedule("orders", "x", deliver_at_ms=far_ms, id=stranger).handle
    assert handle_shard(handle) == 1
    with pytest.raises(grpc.RpcError) as refused:
        leader.stub.Cancel(pb.CancelRequest(handles=[handle]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "handles[0]" in refused.value.details()
    # a message sent without an id is given one of the shard it was sent to
    answer = leader.stub.Schedule(pb.ScheduleRequest(messages=[pb.Message(
        topic="orders", body=b"x", deliver_at_ms=far_ms) for _ in range(10)]), timeout=10)
    assert {shard_of(r.id, SHARDS) for r in answer.results} == {0}
    assert client.cancel_many([r.handle for r in answer.results] + [handle]) == [True] * 11


def test_one_message_of_another_shard_refuses_the_whole_request(cluster: LocalCluster,
                                                                client: Client) -> None:
    """What docs/shards.md says a third party's client meets: the first message of another
    shard is named, and none of the request is scheduled, this shard's messages neither; an
    ack naming another shard's receipt is refused whole as well (INVALID_ARGUMENT)."""
    topic = f"whole-{uuid.uuid4().hex[:8]}"
    own, other = ([f"{topic}-{n}" for n in range(100) if shard_of(f"{topic}-{n}", SHARDS) == k]
                  for k in (0, 1))
    stub = cluster.leader(shard=0).stub
    far_ms = int(time.time() * 1000) + 3_600_000

    def message(message_id: str, routing_key: str = "") -> pb.Message:
        return pb.Message(id=message_id, topic=topic, body=b"x", deliver_at_ms=far_ms,
                          routing_key=routing_key)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Schedule(pb.ScheduleRequest(messages=[message(own[0]), message(other[0]),
                                                   message(own[1]), message(other[1])]),
                      timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (f"messages[1].id: {other[0]!r} belongs to shard 1 of 2, "
                                       "not to this node's shard 0: schedule it there")
    with pytest.raises(grpc.RpcError) as keyed:  # the routing key places it, not the id
        stub.Schedule(pb.ScheduleRequest(messages=[message(own[2], routing_key=other[2])]),
                      timeout=10)
    assert keyed.value.details().startswith("messages[0].routing_key: ")
    again = stub.Schedule(pb.ScheduleRequest(messages=[message(own[0]), message(own[1])]),
                          timeout=10)
    assert [r.duplicate for r in again.results] == [False, False]  # not scheduled before
    client.schedule(topic, "x", delay_ms=0, id=other[3])
    received = wait_for(lambda: client.receive(topic, consumer="c", wait_ms=500), 30,
                        "the message of shard 1")
    assert receipt_shard(received[0].receipt) == 1
    with pytest.raises(grpc.RpcError) as ack:
        stub.AckMessages(pb.SettleRequest(topic=topic, receipts=[received[0].receipt]),
                         timeout=10)
    assert ack.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ack.value.details() == ("receipts[0]: is a receipt of shard '1', not of this shard "
                                   "(0): ack it there")
    received[0].ack()


def test_one_shards_leader_killed_the_other_shard_delivers_on_time_throughout(
        cluster: LocalCluster, client: Client) -> None:
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    start_ms = int(time.time() * 1000) + 1_000
    # 40 messages every 100 ms for 6 s, on both shards; shard 0's leader dies 2 s in
    messages = [Message(topic, "x", deliver_at_ms=start_ms + (n // 40) * 100,
                        id=f"{topic}-{n}") for n in range(2_400)]
    for chunk in range(0, len(messages), 500):
        client.schedule_many(messages[chunk:chunk + 500])
    got: dict[str, Received] = {}
    lock = threading.Lock()
    consumer = client.consume(topic, prefetch=500)

    def consume() -> None:
        for message in consumer:
            with lock:
                got.setdefault(message.id, message)
            message.ack()
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    killed = cluster.leader(shard=0)
    wait_for(lambda: time.time() * 1000 >= start_ms + 2_000, 30, "two seconds of deliveries")
    cluster.signal(killed, signal.SIGKILL)
    try:
        wait_for(lambda: len(got) >= len(messages), 90, "every message delivered")
    finally:
        consumer.close(timeout_s=1)
        reader.join(10)
        cluster.start(killed)
    assert sorted(got) == sorted(m.id for m in messages)  # nothing lost
    late_ms = {shard: [m.delivered_at_ms - m.deliver_at_ms for m in got.values()
                       if shard_of(m.id, SHARDS) == shard] for shard in range(SHARDS)}
    # shard 1 never stopped: its messages came within a second of their time, throughout;
    # shard 0's that came due while it elected a new leader waited for it
    assert max(late_ms[1]) < 1_000, sorted(late_ms[1])[-10:]
    assert max(late_ms[0]) > max(late_ms[1])
    cluster.leader(shard=0, timeout_s=60)



def test_each_shard_is_led_by_its_own_member_and_gets_it_back_after_a_failover(
        cluster: LocalCluster) -> None:
    # at rest, shard k is led by its k-th member: no "host" (member index) leads two shards
    assert cluster.placed() == [cluster.shards[0][0], cluster.shards[1][1]]
    preferred = cluster.shards[1][1]
    cluster.signal(preferred, signal.SIGKILL)
    stand_in = cluster.leader(shard=1, timeout_s=30)
    assert stand_in is not preferred
    cluster.start(preferred)
    # back and caught up, it is handed shard 1 again; shard 0 still has its own leader
    assert cluster.placed(timeout_s=60) == [cluster.shards[0][0], preferred]
    assert "event=leader_handed_over" in stand_in.log_path.read_text()


def test_a_client_with_a_stale_map_reads_it_again_when_a_node_refuses(
        cluster: LocalCluster, client: Client) -> None:
    """As after shards were added: the client thinks the cluster is shard 0 alone. The parts of
    its requests shard 0 refuses go, once the map is read anew, to their shard."""
    stale = cluster.client(timeout_s=30)
    stale._shards.routers = stale._shards.routers[:1]
    stale._shards.routers[0].targets = [n.grpc_address for n in cluster.shards[0]]
    stale._shards.known = True
    topic = f"stale-{uuid.uuid4().hex[:8]}"
    far_ms = int(time.time() * 1000) + 3_600_000
    with stale:
        results = stale.schedule_many([Message(topic, "x", deliver_at_ms=far_ms)
                                       for _ in range(40)])
        assert stale.shards().count == SHARDS
        assert not any(r.duplicate for r in results)  # the part shard 0 took is not sent again
        assert {handle_shard(r.handle) for r in results} == {0, 1}
    assert client.cancel_many([r.handle for r in results]) == [True] * 40


def test_the_async_client_schedules_and_consumes_over_every_shard(cluster: LocalCluster) -> None:
    topic = f"async-{uuid.uuid4().hex[:8]}"

    async def run() -> set[str]:
        got: set[str] = set()
        async with AsyncClient([n.grpc_address for n in cluster.nodes], timeout_s=30,
                               credentials=cluster.credentials()) as client:
            now_ms = int(time.time() * 1000)
            results = await client.schedule_many([Message(topic, "x", deliver_at_ms=now_ms)
                                                  for _ in range(100)])
            assert {handle_shard(r.handle) for r in results} == {0, 1}
            async with client.consume(topic, prefetch=16) as consumer:
                async for message in consumer:
                    assert message.id not in got
                    got.add(message.id)
                    message.ack()
                    if len(got) == len(results):
                        break
            assert await client.cancel_many([r.handle for r in results]) == [False] * 100
            return got
    assert len(asyncio.run(asyncio.wait_for(run(), 60))) == 100


def test_a_consumer_shares_its_prefetch_among_the_shards(cluster: LocalCluster,
                                                         client: Client) -> None:
    """A consumer of two shards holds about ``prefetch`` messages, half from each shard, not
    ``prefetch`` from each: a slow consumer would hold twice as many, and more of their leases
    would run out before it acknowledged them."""
    topic = f"prefetch-{uuid.uuid4().hex[:8]}"
    client.create_group(topic, "slow")
    due_ms = int(time.time() * 1000)
    client.schedule_many([Message(topic, b"x", deliver_at_ms=due_ms, id=f"{topic}-{n}")
                          for n in range(100)])

    def leased() -> list[int]:
        infos = [cluster.leader(shard=shard).info(timeout_s=5) for shard in range(SHARDS)]
        return [sum(g.leased for g in info.groups if (g.topic, g.group) == (topic, "slow"))
                if info is not None else -1 for info in infos]
    with client.consume(topic, group="slow", prefetch=8) as consumer:
        next(consumer)  # takes one, acknowledges nothing: its credit comes back
        wait_for(lambda: all(count in (4, 5) for count in leased()), 10,
                 "each shard to lease its half of the prefetch (and the credit returned)")
