"""RocketMQ 5's official clients, unchanged, against a real 3-node cluster's RocketMQ
listeners (TLS, signed calls): delay messages, a recall, a SimpleConsumer's retry and ack, a
PushConsumer's failure and retry, two groups each receiving every message, and a leader killed
while a producer sends.

Each client runs in subprocesses (`official_client.py` for the Python client, sending whole
seconds as its example does; `node/official_client.mjs` for the Node.js one); each points at
one node, as a client behind a Kubernetes Service does (a list of addresses fails the
certificate's host check in the client: gRPC takes the whole list as the host name).
`make test` runs the Python client; `make compat` sets ``TICKWHEEL_COMPAT=python,node`` after
installing the Node.js client from `node/package-lock.json`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmqtests import TOPIC, delay_message, signed

from tickwheel.client.shards import handle_shard, shard_of
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.rocketmq.v2 import service_pb2 as svc
from tickwheel.rocketmq.v2 import service_pb2_grpc as svc_grpc

pytestmark = pytest.mark.cluster

HERE = Path(__file__).parent
DRIVERS = {"python": [sys.executable, str(HERE / "official_client.py")],
           "node": ["node", str(HERE / "node" / "official_client.mjs")]}
LANGUAGES = os.environ.get("TICKWHEEL_COMPAT", "python").split(",")


@pytest.fixture(scope="module", params=LANGUAGES)
def language(request: pytest.FixtureRequest) -> str:
    """The official client a test drives; each has a topic and groups of its own, on one
    cluster."""
    if request.param not in DRIVERS:
        pytest.fail(f"TICKWHEEL_COMPAT names {request.param!r}; known: {sorted(DRIVERS)}")
    if request.param == "node" and not (HERE / "node" / "node_modules").is_dir():
        pytest.fail("the Node.js client is not installed: run make compat, which runs npm ci")
    return str(request.param)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("rocketmq")
    # the retry ladder starts at 1 s, so a PushConsumer's failed message returns within seconds
    with LocalCluster(root, 3, rocketmq=True, extra_args=("--retry-start-level", "1")) as made:
        made.leader(timeout_s=30)
        yield made


class Client:
    """One official client process."""

    def __init__(self, cluster: LocalCluster, node: LocalNode, language: str, role: str,
                 **options: object) -> None:
        assert cluster.security is not None and node.rocketmq_address is not None
        config = {"endpoint": node.rocketmq_address, "access_key": "admin",
                  "secret_key": cluster.rocketmq_secret_key("admin"), **options,
                  "topic": f"orders-{language}"}
        if "group" in options:
            config["group"] = f"{options['group']}-{language}"
        self.process = subprocess.Popen([*DRIVERS[language], role, json.dumps(config)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env={**os.environ,
                                        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH":
                                            str(cluster.security.ca_file)})
        self.events: list[dict] = []

    def next_event(self) -> dict | None:
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line:
            return None
        event = json.loads(line)
        self.events.append(event)
        return event

    def wait_for(self, name: str) -> dict:
        while (event := self.next_event()) is not None:
            if event["event"] == name:
                return event
        raise AssertionError(f"the client ended before {name!r}: {self.stderr()}")

    def finish(self, timeout_s: float = 90) -> list[dict]:
        """Every event until the client exits (killed after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.next_event() is not None:
            pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        assert self.process.returncode == 0, self.stderr()
        return self.events

    def stderr(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        return (self.process.stderr.read() if self.process.stderr else "")[-3000:]

    def of(self, name: str) -> list[dict]:
        return [event for event in self.events if event["event"] == name]


def test_delay_messages_a_recall_and_a_simple_consumer_that_retries_then_acks(
        cluster: LocalCluster, language: str) -> None:
    node = cluster.nodes[1]
    consumer = Client(cluster, node, language, "simple", group="billing", tag="created",
                      expect=4, retry_s=2, timeout_s=45, quiet_s=3)
    consumer.wait_for("started")
    producer = Client(cluster, node, language, "produce", count=6, delay_s=3, recall=[1],
                      tags=["created", "created", "created", "shipped", "created", "created"],
                      prefix="simple")
    sent = {event["id"]: event for event in producer.finish() if event["event"] == "sent"}
    assert len(sent) == 6
    recalled = {event["id"] for event in producer.of("recalled")}
    assert recalled == {next(i for i, e in sent.items() if e["body"] == "simple-1")}
    consumer.finish()
    received = consumer.of("received")
    wanted = {i for i, e in sent.items() if e["tag"] == "created"} - recalled
    assert {event["id"] for event in received} == wanted  # the filter and the recall held
    for event in received:
        assert event["at"] >= sent[event["id"]]["due_s"] - 0.05, "delivered before due"
        assert event["keys"] and event["tag"] == "created"
    [put_back] = consumer.of("put_back")
    again = [e for e in received if e["id"] == put_back["id"]]
    assert [e["attempt"] for e in again] == [1, 2]
    # invisible for the 2 s asked, then ready at once: no step of the retry ladder (1 s here)
    # on top, as RocketMQ's invisible duration means
    assert 1.9 <= again[1]["at"] - put_back["at"] < 2.8
    assert {event["id"] for event in consumer.of("acked")} == wanted
    assert not [e for e in received if e.get("late")], "an acked message came again"
    assert not [e for e in received if e["flagged"]]


def test_a_push_consumer_fails_a_message_and_gets_it_again_and_two_groups_each_get_all(
        cluster: LocalCluster, language: str) -> None:
    node = cluster.nodes[2]
    billing = Client(cluster, node, language, "push", group="push-billing", expect=5,
                     fail_bodies=["push-2"], timeout_s=45, quiet_s=2)
    shipping = Client(cluster, node, language, "push", group="push-shipping", expect=5,
                      timeout_s=45, quiet_s=2)
    billing.wait_for("started")
    shipping.wait_for("started")
    producer = Client(cluster, node, language, "produce", count=5, delay_s=2, prefix="push")
    sent = {event["id"] for event in producer.finish() if event["event"] == "sent"}
    assert len(sent) == 5
    billing.finish()
    shipping.finish()
    for group in (billing, shipping):
        assert {event["id"] for event in group.of("consumed")} == sent
    [failed] = billing.of("failed")
    retried = [e for e in billing.of("consumed") if e["id"] == failed["id"]]
    assert [e["attempt"] for e in retried] == [2]
    assert not shipping.of("failed")
    assert len(shipping.of("consumed")) == 5  # no duplicates in the other group


def test_a_leader_killed_while_a_producer_sends_loses_nothing(cluster: LocalCluster,
                                                               language: str) -> None:
    leader = cluster.leader(timeout_s=20)
    node = next(n for n in cluster.nodes if n is not leader)  # the client's endpoint stays up
    count = 60
    consumer = Client(cluster, node, language, "simple", group="audit", expect=count,
                      timeout_s=80, quiet_s=2, invisible_s=20)
    consumer.wait_for("started")
    producer = Client(cluster, node, language, "produce", count=count, delay_s=2, pause_s=0.05,
                      prefix="kill")
    while producer.next_event() is not None and len(producer.of("sent")) < 20:
        pass
    cluster.signal(leader, signal.SIGKILL)
    producer.finish()
    cluster.start(leader)
    _each_received_once(producer, consumer, count)


def _each_received_once(producer: Client, consumer: Client, count: int) -> set[str]:
    """The ids ``producer`` sent, all ``count`` of them, once ``consumer`` has received each
    (a repeat only flagged, or as a later attempt)."""
    sent = {event["id"] for event in producer.of("sent")}
    assert not producer.of("send_failed"), producer.of("send_failed")
    assert len(sent) == count
    consumer.finish()
    received = consumer.of("received")
    assert {event["id"] for event in received} == sent, "an acknowledged send was lost"
    firsts: set[str] = set()
    for event in received:
        if event["id"] in firsts and not event["flagged"]:
            assert event["attempt"] > 1, f"an unflagged duplicate: {event}"
        firsts.add(event["id"])
    return sent


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two shards of three nodes, each serving RocketMQ."""
    with LocalCluster(tmp_path_factory.mktemp("rocketmq-shards"), 3, rocketmq=True,
                      shards=2) as made:
        made.leaders(timeout_s=60)
        made.placed()
        yield made


def _routes(cluster: LocalCluster, node: LocalNode) -> list[tuple[int, str, str]]:
    """``(queue id, broker, endpoint)`` of each queue ``node`` routes the topic to."""
    assert cluster.security is not None and node.rocketmq_address is not None
    credentials = grpc.ssl_channel_credentials(cluster.security.ca_file.read_bytes())
    with grpc.secure_channel(node.rocketmq_address, credentials) as channel:
        answer = svc_grpc.MessagingServiceStub(channel).QueryRoute(
            svc.QueryRouteRequest(topic=rmq.Resource(name=TOPIC)), metadata=signed(cluster))
    assert answer.status.code == rmq.Code.OK, answer.status
    return [(queue.id, queue.broker.name,
             f"{queue.broker.endpoints.addresses[0].host}:"
             f"{queue.broker.endpoints.addresses[0].port}") for queue in answer.message_queues]


def test_two_shards_route_a_queue_per_shard_at_its_leader(sharded: LocalCluster) -> None:
    """Queue 0 of broker tickwheel-k for shard k (the Node.js client receives from queues
    numbered 0 alone), at its leader, from every node; a node asks at most once a second."""
    expected = [(0, f"tickwheel-{shard}", leader.rocketmq_address)
                for shard, leader in enumerate(sharded.placed())]
    for node in sharded.nodes:  # every node, of either shard, names both shards' leaders
        wait_for(lambda node=node: _routes(sharded, node) == expected, 5,  # type: ignore[misc]
                 f"{node.rocketmq_address} to route to each shard's leader")


def test_a_send_retried_through_another_shards_queue_is_one_message(
        sharded: LocalCluster) -> None:
    """A RocketMQ producer retries a send through the next queue, another shard: the message
    goes to the shard of its id wherever it is sent, so the retry is answered as the same
    message, and it is delivered once."""
    assert sharded.security is not None
    credentials = grpc.ssl_channel_credentials(sharded.security.ca_file.read_bytes())
    client = sharded.client(timeout_s=30)
    client.create_group(TOPIC, "retried")  # before the message comes due: it is kept for it
    message = delay_message(int(time.time()) + 2, body=b"retried")
    handles = []
    for shard in (0, 1):
        node = sharded.shards[shard][1]
        assert node.rocketmq_address is not None
        with grpc.secure_channel(node.rocketmq_address, credentials) as channel:
            answer = svc_grpc.MessagingServiceStub(channel).SendMessage(
                svc.SendMessageRequest(messages=[message]), metadata=signed(sharded))
        assert answer.status.code == rmq.Code.OK, answer.status
        handles.append(answer.entries[0].recall_handle)
    assert handles[0] == handles[1]
    owner = shard_of(message.system_properties.message_id, 2)
    assert handle_shard(int(handles[0].partition(".")[0])) == owner
    with client:
        got = client.receive(TOPIC, consumer="c", group="retried", wait_ms=4_000)
        assert [m.body for m in got] == [b"retried"]
        assert client.ack_receipts(TOPIC, "retried", [m.receipt for m in got]) == [True]
        assert client.receive(TOPIC, consumer="c", group="retried", wait_ms=1_500) == []


def test_two_shards_one_group_gets_every_message_once_through_a_shard_leaders_death(
        sharded: LocalCluster, language: str) -> None:
    """The official client, given one node: its sends spread over both shards' queues, and
    one SimpleConsumer of a group receives every message once, while shard 1's leader is
    killed; the route then names shard 1's new leader."""
    node = sharded.shards[0][1]
    count = 40
    consumer = Client(sharded, node, language, "simple", group="sharded", expect=count,
                      timeout_s=80, quiet_s=2, invisible_s=20)
    consumer.wait_for("started")
    producer = Client(sharded, node, language, "produce", count=count, delay_s=2,
                      pause_s=0.05, prefix="sharded")
    while producer.next_event() is not None and len(producer.of("sent")) < 10:
        pass
    killed = sharded.leader(shard=1)
    sharded.signal(killed, signal.SIGKILL)
    try:
        producer.finish()
        sent = _each_received_once(producer, consumer, count)
        assert {shard_of(message_id, 2) for message_id in sent} == {0, 1}
        new_leader = sharded.leader(shard=1, timeout_s=20)
        assert new_leader is not killed
        wait_for(lambda: _routes(sharded, node)[1][2] == new_leader.rocketmq_address, 10,
                 "the route to name shard 1's new leader")
    finally:
        sharded.start(killed)
        sharded.placed()  # the next test finds every shard led by its own member
