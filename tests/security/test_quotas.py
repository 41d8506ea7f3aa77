"""Quotas per principal on real nodes: a 3-node cluster started as users start it (TLS, tokens,
an access file whose ``[principal.quota]`` tables bound some principals), called through the
leader and through a follower. What a third party sees is read off the wire: the status
code, its message, and the ``RetryInfo`` and ``QuotaFailure`` in ``grpc-status-details-bin``,
parsed here with google.rpc's own messages. The rules without processes:
test_quota_rules.py; the client library's waits: tests/client/test_retry_advice.py.

On the build before quotas, every call below succeeded: nothing bounded a principal but the
node's own limits."""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from rocketmqtests import TOPIC, delay_message, signed

from tickwheel.client import Client, Message, QuotaExceeded
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.rocketmq.v2 import service_pb2 as svc
from tickwheel.rocketmq.v2 import service_pb2_grpc as svc_grpc
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cluster

PRINCIPALS = {
    "paced": [{"actions": ["schedule"], "topics": ["paced"]}],
    "hammer": [{"actions": ["schedule"], "topics": ["hammer"]}],
    "neighbour": [{"actions": ["schedule"], "topics": ["neighbour"]}],
    "pending": [{"actions": ["schedule", "cancel", "consume"], "topics": ["pending.*"]}],
    "streams": [{"actions": ["consume"], "topics": ["streams"]}],
    "changed": [{"actions": ["schedule"], "topics": ["changed"]}],
    "forwarded": [{"actions": ["schedule"], "topics": ["forwarded"]}],
    "sender": [{"actions": ["schedule"], "topics": [TOPIC]}],
}
QUOTAS = {
    "paced": "schedule_msgs_per_s = 2",
    "hammer": "schedule_msgs_per_s = 5",
    "pending": "max_pending_msgs = 10",
    "streams": "max_consumer_streams = 2",
    "changed": "schedule_msgs_per_s = 1",
    "forwarded": "schedule_msgs_per_s = 2",
    "sender": "schedule_msgs_per_s = 2",
}
"""``neighbour`` (and ``admin``) have none."""
QUOTA_TABLE = "\n[principal.quota]\n"


def with_quotas(access: str, quotas: dict[str, str]) -> str:
    """The access file ``access`` (as `LocalCluster` writes it: each principal's block opens
    with its name) with a ``[principal.quota]`` table of the lines given for a principal, in
    place of the one made here before, if any."""
    blocks = access.split("[[principal]]\n")
    for index, block in enumerate(blocks[1:], start=1):
        name = json.loads(block.split("\n", 1)[0].removeprefix("name = "))
        plain = block.split(QUOTA_TABLE)[0]
        blocks[index] = f"{plain}{QUOTA_TABLE}{quotas[name]}\n" if quotas.get(name) else plain
    return "[[principal]]\n".join(blocks)


def rewrite(path: Path, text: str) -> None:
    """Replace the file at once (a rename), as a Kubernetes Secret's mount does."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.chmod(fresh, 0o600)
    os.replace(fresh, path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("quotas"), principals=PRINCIPALS,
                           metrics=True, rocketmq=True)
    assert cluster.security is not None
    access = cluster.security.access_file
    rewrite(access, with_quotas(access.read_text(), QUOTAS))
    with cluster:
        cluster.leader(timeout_s=30)
        yield cluster


def follower(cluster: LocalCluster) -> LocalNode:
    leader = cluster.leader()
    return next(node for node in cluster.nodes if node is not leader)


def stub(cluster: LocalCluster, node: LocalNode, principal: str) -> pb_grpc.TickwheelStub:
    return pb_grpc.TickwheelStub(open_channel(node.grpc_address,
                                              cluster.credentials(principal), ()))


def request(topic: str, count: int = 1) -> pb.ScheduleRequest:
    tag = uuid.uuid4().hex
    return pb.ScheduleRequest(messages=[
        pb.Message(id=f"{tag}-{i}", topic=topic, body=b"x", delay_ms=600_000)
        for i in range(count)])


def refusal(call: Callable[[], object]) -> grpc.RpcError:
    """The error ``call()`` raises."""
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def details(error: grpc.RpcError) -> tuple[int, str, int]:
    """What a refusal over a quota says, read as any gRPC client reads it: the retry's delay
    in ms, and the quota and its value."""
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    data = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(data)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert status.message == error.details()
    retry, failure = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
    assert status.details[0].Unpack(retry) and status.details[1].Unpack(failure)
    violation = failure.violations[0]
    delay_ms = retry.retry_delay.seconds * 1000 + retry.retry_delay.nanos // 1_000_000
    return delay_ms, violation.quota_id, violation.quota_value


def refusals(node: LocalNode, principal: str, quota: str) -> float:
    """``tickwheel_quota_refusals_total`` of ``principal`` and ``quota`` on ``node``."""
    with urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=5) as page:
        text = page.read().decode()
    series = f'tickwheel_quota_refusals_total{{principal="{principal}",quota="{quota}"}} '
    return sum(float(line.removeprefix(series)) for line in text.splitlines()
               if line.startswith(series))


def test_a_principal_over_its_schedule_rate_is_told_when_to_retry_and_the_library_waits(
        cluster: LocalCluster) -> None:
    leader = cluster.leader()
    paced = stub(cluster, leader, "paced")
    paced.Schedule(request("paced", 2), timeout=10)  # the burst: a second's worth
    error = refusal(lambda: paced.Schedule(request("paced"), timeout=10))
    delay_ms, quota, limit = details(error)
    assert (quota, limit) == ("schedule_msgs_per_s", 2) and 0 < delay_ms <= 500
    assert "principal 'paced' is over its schedule_msgs_per_s of 2" in error.details()
    before = refusals(leader, "paced", "schedule_msgs_per_s")
    assert before >= 1
    started = time.monotonic()
    with Client(leader.grpc_address, timeout_s=20, credentials=cluster.credentials("paced")
                ) as client:
        handles = [client.schedule("paced", b"x", delay_ms=600_000).handle for _ in range(6)]
    elapsed_s = time.monotonic() - started
    assert len(set(handles)) == 6
    assert elapsed_s >= 1.9  # 6 at 2 a second from an empty bucket (2 at most held)
    # Each wait was the node's advice (4 waits of up to 500 ms, a refusal each; fewer when
    # the machine is slow); the library's own back-off (at most 250 ms) was refused 39 times.
    assert refusals(leader, "paced", "schedule_msgs_per_s") - before <= 8


def test_another_principal_sees_no_change_while_one_is_refused(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    hammer = stub(cluster, leader, "hammer")
    refused: list[grpc.StatusCode] = []
    stop = threading.Event()

    def hammering() -> None:
        while not stop.is_set():
            try:
                hammer.Schedule(request("hammer", 5), timeout=10)
            except grpc.RpcError as error:
                refused.append(error.code())
    thread = threading.Thread(target=hammering)
    thread.start()
    try:
        wait_for(lambda: len(refused) >= 3, 15, "the hammering principal to be refused")
        neighbour = stub(cluster, leader, "neighbour")  # no retries: a refusal would raise
        for _ in range(100):
            neighbour.Schedule(request("neighbour", 5), timeout=10)
        during = len(refused)
    finally:
        stop.set()
        thread.join()
    assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert during > 3  # refused all along
    assert refusals(leader, "neighbour", "schedule_msgs_per_s") == 0


def test_max_pending_refuses_past_the_limit_and_admits_again_once_cancelled_or_delivered(
        cluster: LocalCluster) -> None:
    leader = cluster.leader()
    pending = stub(cluster, leader, "pending")
    with Client(leader.grpc_address, timeout_s=20,
                credentials=cluster.credentials("pending")) as client:
        later = client.schedule_many([Message(f"pending.{topic}", b"x", delay_ms=600_000)
                                      for topic in ("a",) * 6 + ("b",) * 4])
        error = refusal(lambda: pending.Schedule(request("pending.c"), timeout=10))
        assert details(error)[1:] == ("max_pending_msgs", 10)
        assert "(10 pending in its topics, 1 more asked)" in error.details()
        with Client(leader.grpc_address, timeout_s=1.5,
                    credentials=cluster.credentials("pending")) as hurried, \
                pytest.raises(QuotaExceeded) as still_over:
            hurried.schedule("pending.a", b"x", delay_ms=600_000)
        assert still_over.value.quota == "max_pending_msgs"
        assert client.cancel_outcomes([scheduled.handle for scheduled in later[:3]])
        soon = [Message("pending.soon", b"x", delay_ms=2_000) for _ in range(3)]
        client.schedule_many(soon)  # admitted once the cancels are counted
        refusal(lambda: pending.Schedule(request("pending.c"), timeout=10))
        with client.consume("pending.soon") as consumer:
            delivered = [message for _, message in zip(range(3), consumer, strict=False)]
            for message in delivered:
                message.ack()
        assert {message.id for message in delivered} == {message.id for message in soon}
        # admitted once the cursor has passed them: the library retries meanwhile
        client.schedule_many([Message("pending.c", b"x", delay_ms=600_000)
                              for _ in range(3)])
        refusal(lambda: pending.Schedule(request("pending.c"), timeout=10))


class Stream:
    """A raw consumer stream (``Receive``) of ``principal`` on ``node``, subscribed to a group
    of ``topic``; `refusal` waits for its end."""

    def __init__(self, cluster: LocalCluster, node: LocalNode, principal: str, topic: str,
                 group: str) -> None:
        self._requests: queue.Queue[pb.ReceiveRequest | None] = queue.Queue()
        self._requests.put(pb.ReceiveRequest(subscribe=pb.Subscribe(
            topic=topic, group=group, consumer=f"c-{uuid.uuid4().hex[:8]}", credits=1)))
        self.call = stub(cluster, node, principal).Receive(iter(self._requests.get, None))

    def refusal(self) -> grpc.RpcError:
        return refusal(lambda: next(self.call))

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def consumers(cluster: LocalCluster, topic: str, group: str) -> int:
    """The consumer streams the leader serves on the group."""
    with cluster.client() as admin:
        return sum(g.consumers for g in admin.cluster_info(cluster.leader().grpc_address).groups
                   if (g.topic, g.group) == (topic, group))


def test_max_consumer_streams_refuses_the_extra_stream_through_any_node(
        cluster: LocalCluster) -> None:
    leader, other = cluster.leader(), follower(cluster)
    streams = [Stream(cluster, leader, "streams", "streams", "g"),
               Stream(cluster, other, "streams", "streams", "g")]
    try:
        wait_for(lambda: consumers(cluster, "streams", "g") == 2, 15, "two streams open")
        for node in (leader, other):
            extra = Stream(cluster, node, "streams", "streams", "g")
            error = extra.refusal()
            assert details(error)[1:] == ("max_consumer_streams", 2)
            assert "(2 open on this node)" in error.details()
        streams.pop(0).close()
        wait_for(lambda: consumers(cluster, "streams", "g") == 1, 15, "a stream closed")
        streams.append(Stream(cluster, other, "streams", "streams", "g"))
        wait_for(lambda: consumers(cluster, "streams", "g") == 2, 15, "its place taken")
    finally:
        for stream in streams:
            stream.close()


def test_a_quota_changed_in_the_access_file_takes_effect_without_a_restart(
        cluster: LocalCluster) -> None:
    assert cluster.security is not None
    access = cluster.security.access_file
    leader = cluster.leader()
    changed = stub(cluster, leader, "changed")
    changed.Schedule(request("changed"), timeout=10)
    assert details(refusal(lambda: changed.Schedule(request("changed"), timeout=10)))[1:] == (
        "schedule_msgs_per_s", 1)
    loads = [node.log_path.read_text().count("event=access_file_loaded")
             for node in cluster.nodes]
    pids = [node.pid for node in cluster.nodes]
    try:
        rewrite(access, with_quotas(access.read_text(),
                                    {**QUOTAS, "changed": "schedule_msgs_per_s = 1000"}))
        wait_for(lambda: all(reloaded(node, before)
                             for node, before in zip(cluster.nodes, loads, strict=True)),
                 15, "every node to reread its access file")
        changed.Schedule(request("changed", 500), timeout=10)  # a new bucket: a full one
        assert [node.pid for node in cluster.nodes] == pids
    finally:
        rewrite(access, with_quotas(access.read_text(), QUOTAS))


def reloaded(node: LocalNode, before: int) -> bool:
    """Whether ``node`` has loaded its access file more than ``before`` times."""
    return node.log_path.read_text().count("event=access_file_loaded") > before


def test_a_schedule_through_a_follower_is_bounded_by_the_leader_the_same(
        cluster: LocalCluster) -> None:
    other = follower(cluster)
    forwarded = stub(cluster, other, "forwarded")
    started = time.monotonic()
    forwarded.Schedule(request("forwarded", 2), timeout=10)
    error = refusal(lambda: forwarded.Schedule(request("forwarded"), timeout=10))
    delay_ms, quota, limit = details(error)  # the leader's details, passed on as they came
    assert (quota, limit) == ("schedule_msgs_per_s", 2) and 0 < delay_ms <= 500
    assert dict(error.trailing_metadata())["tickwheel-leader"] == (
        cluster.leader().grpc_address)
    assert refusals(other, "forwarded", "schedule_msgs_per_s") == 0  # counted on the leader
    with Client(other.grpc_address, timeout_s=20,
                credentials=cluster.credentials("forwarded")) as client:
        for _ in range(4):
            client.schedule("forwarded", b"x", delay_ms=600_000)
    assert time.monotonic() - started >= 1.9  # 2 + 4 at 2 a second, 2 held at most


def test_a_rocketmq_producer_is_bounded_by_its_principals_rate_through_any_node(
        cluster: LocalCluster) -> None:
    """A RocketMQ send is a schedule of the principal its signature names: through a
    follower's RocketMQ listener and the leader's, it is refused over the rate, as RocketMQ's
    ``TOO_MANY_REQUESTS`` (its clients retry that with their own back-off)."""
    assert cluster.security is not None
    credentials = grpc.ssl_channel_credentials(cluster.security.ca_file.read_bytes())
    for node in (follower(cluster), cluster.leader()):
        assert node.rocketmq_address is not None
        with grpc.secure_channel(node.rocketmq_address, credentials) as channel:
            sender = svc_grpc.MessagingServiceStub(channel)
            answers = []
            for _ in range(10):  # 2 messages a send, 2 a second: the second send or so
                answers.append(sender.SendMessage(svc.SendMessageRequest(messages=[
                    delay_message(int(time.time()) + 600) for _ in range(2)]),
                    metadata=signed(cluster, "sender"), timeout=10).status)
                if answers[-1].code != rmq.Code.OK:
                    break
        assert answers[-1].code == rmq.Code.TOO_MANY_REQUESTS, answers
        assert "principal 'sender' is over its schedule_msgs_per_s of 2" in answers[-1].message
