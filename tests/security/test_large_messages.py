"""Any message within the limits is delivered (issue 37, item 3), whatever the consumer's credits.

A response to a consumer carried as many messages as the consumer had credits (at most 256),
however large; gRPC refuses to send one above 64 MiB, the leases ended with the stream and the
messages went out again in the same response, for good. On the build before this: a raw
`Receive` stream asking 100 credits got 0 of 20 messages of 4 MiB in 60 s (every stream
failing, "Sent message larger than max (85219160 vs. 67108864)") and 0 of 80 of 1,153,433
bytes; `Client.consume` with its defaults, 0 of 20 and 0 of 80 (`RequestTooLarge`); with 1,000
credits, as `AckingConsumer` asks, 0 of 800 of 256 KiB too (67139323 bytes); `receive` of 100
a call, 0 of 20 and 5 of 80; RocketMQ's SimpleConsumer at a follower, a failed receive
("Sent message larger than max (68175360 vs. 67108864)") before the 20 came. With 64 or 100
credits, 256 KiB messages passed already. Now a
response also carries at most `CourierConfig.max_batch_bytes` of messages, on every path: the
stream (through a follower too), the stream-less `ReceiveMessages` and RocketMQ's
`ReceiveMessage` (through a follower, which forwards it).

One cluster for the module: each set of messages is scheduled once, due at once, and each way
of receiving reads a consumer group of its own (every group gets every message), after every
message is ready in it, so that the consumer's first credits meet them all. The large set is
as large as the validation allows: 4 MiB bodies, 256-byte ids, 249-character topic, 64 KiB of
properties.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from tickwheel.client import Client, Consumer, Message, TickwheelClientError
from tickwheel.client._core import CHANNEL_OPTIONS
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.node.api import forward
from tickwheel.node.api.calls import receive_response
from tickwheel.node.delivery.batches import (
    ENVELOPE_BYTES,
    GRPC_MESSAGE_BYTES,
    delivered_bytes,
    fitting,
    split,
)
from tickwheel.node.delivery.courier import CourierConfig
from tickwheel.node.delivery.sent import Sent
from tickwheel.node.rocketmq import convert
from tickwheel.replication import Delivery, HandleCipher, LeaseRef, encode_receipt
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc
from tickwheel.wheel import DueMessage

ROCKETMQ_DRIVER = Path(__file__).parents[1] / "rocketmq" / "official_client.py"
DEADLINE_S = 60
"""How long a consumer may take to get a whole set (about 200 MiB at most)."""
CREDITS = 100
"""What the raw stream asks for, and the stream-less calls' ``max_messages``."""
LARGE_PROPERTIES = {f"k{i:02}": "v" * 1_021 for i in range(64)}
"""64 entries of 1,024 bytes: the most properties a message may carry (``max_properties``,
``max_properties_bytes``)."""


@dataclass(frozen=True)
class MessageSet:
    topic: str
    count: int
    body_bytes: int
    id_bytes: int = 9
    properties: tuple[tuple[str, str], ...] = ()

    def ids(self) -> list[str]:
        """Unique across sets too: the dedupe window knows ids, not topics."""
        return [f"{self.topic[:4]}-{i:04}".ljust(self.id_bytes, "i") for i in range(self.count)]


SETS = {"4MiB": MessageSet("L" * 249, 20, 4 << 20, id_bytes=256,
                           properties=tuple(LARGE_PROPERTIES.items())),
        "256KiB": MessageSet("many-256KiB", 800, 256 << 10),
        "1.1MiB": MessageSet("odd-1153433", 80, 1_153_433)}
PREFETCH, STREAM, RECEIVE, ROCKETMQ = "prefetch", "stream", "receive", "rocketmq"
GROUPS = (PREFETCH, STREAM, RECEIVE, ROCKETMQ, "")
"""A consumer group per way of receiving; the client library's defaults read the topic's
default group, created last (a topic keeps its default group only once it has a named one)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("large"), 3, rocketmq=True) as started:
        started.leader(timeout_s=30)
        with started.client(timeout_s=60) as client:
            for message_set in SETS.values():
                schedule_ready(client, message_set)
        yield started


def schedule_ready(client: Client, message_set: MessageSet) -> None:
    """Schedule the set due now, once every group exists, and wait until every group holds
    all of it ready."""
    for group in GROUPS:
        client.create_group(message_set.topic, group)
    body, properties = b"x" * message_set.body_bytes, dict(message_set.properties)
    ids, per_request = message_set.ids(), max(1, (4 << 20) // message_set.body_bytes)
    due_ms = time.time_ns() // 1_000_000
    for start in range(0, len(ids), per_request):
        client.schedule_many([Message(message_set.topic, body, deliver_at_ms=due_ms, id=message_id,
                                      properties=properties)
                              for message_id in ids[start:start + per_request]])

    def ready() -> bool:
        counts = {info.group: info.ready for info in client.cluster_info().groups
                  if info.topic == message_set.topic}
        return counts == dict.fromkeys(GROUPS, message_set.count)
    wait_for(ready, 60, f"{message_set.count} messages ready in each of {GROUPS}")


@dataclass(frozen=True)
class Got:
    id: str
    body_bytes: int
    attempt: int
    flagged: bool
    """``possible_duplicate``."""


@dataclass
class Tally:
    """What a consumer received, and the failures it met on the way."""

    got: list[Got] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def distinct(self) -> int:
        return len({got.id for got in self.got})


@contextmanager
def each_once(cluster: LocalCluster, message_set: MessageSet) -> Iterator[Tally]:
    """A tally for the test to fill; then every message of the set must have come once, at
    its first attempt, without a failure on the way. If the leader changed meanwhile (a host
    short of CPU), the new leader sends again what the old one had sent, and a consumer may
    meet errors: then each message must have come once unflagged at most."""
    tally, term = Tally(), leader_term(cluster)
    yield tally
    copies = Counter(got.id for got in tally.got)
    assert len(copies) == message_set.count, (
        f"{len(copies)} of {message_set.count} messages received; errors: {tally.errors[:3]}")
    assert set(copies) == set(message_set.ids())
    assert {got.body_bytes for got in tally.got} == {message_set.body_bytes}
    if leader_term(cluster) != term:
        unflagged = Counter(got.id for got in tally.got if not got.flagged)
        assert max(unflagged.values(), default=1) == 1, unflagged.most_common(3)
        return
    assert not tally.errors, tally.errors[:3]
    assert max(copies.values()) == 1, copies.most_common(3)
    assert {(got.attempt, got.flagged) for got in tally.got} == {(1, False)}


def leader_term(cluster: LocalCluster) -> int:
    info = cluster.leader(timeout_s=30).info(timeout_s=5)
    return -1 if info is None else info.term


def follower(cluster: LocalCluster) -> LocalNode:
    leader = cluster.leader()
    return next(node for node in cluster.nodes if node is not leader)


@pytest.mark.cluster
@pytest.mark.parametrize("name", SETS)
def test_the_client_librarys_consumer_gets_each_message_once(cluster: LocalCluster,
                                                             name: str) -> None:
    message_set = SETS[name]
    with each_once(cluster, message_set) as tally, cluster.client(timeout_s=30) as client:
        consume(client.consume(message_set.topic), message_set, tally)


@pytest.mark.cluster
@pytest.mark.parametrize("name", SETS)
def test_a_consumer_holding_1000_credits_gets_each_message_once(cluster: LocalCluster,
                                                                name: str) -> None:
    """As `AckingConsumer` consumes: a full response of 256 messages of 256 KiB is 64 MiB
    too."""
    message_set = SETS[name]
    with each_once(cluster, message_set) as tally, cluster.client(timeout_s=30) as client:
        consume(client.consume(message_set.topic, group=PREFETCH, prefetch=1_000),
                message_set, tally)


def consume(consumer: Consumer, message_set: MessageSet, tally: Tally) -> None:
    """Take (and ack) what ``consumer`` gets until it has every message of the set, or
    `DEADLINE_S` passes."""
    with consumer:
        timer = threading.Timer(DEADLINE_S, consumer.close)
        timer.start()
        try:
            for message in consumer:
                tally.got.append(Got(message.id, len(message.body), message.attempt,
                                     message.possible_duplicate))
                assert message.properties == dict(message_set.properties)
                message.ack()
                if tally.distinct() == message_set.count:
                    break
        except TickwheelClientError as error:  # one the library does not retry
            tally.errors.append(repr(error))
        finally:
            timer.cancel()


@pytest.mark.cluster
@pytest.mark.parametrize("name", SETS)
def test_a_raw_stream_through_a_follower_asking_100_credits_gets_each_message_once(
        cluster: LocalCluster, name: str) -> None:
    """A consumer of the API itself, with the client library's channel options: it acks
    what it gets and gives the credits back, and opens a stream again if one fails. The
    follower passes the leader's responses on."""
    message_set = SETS[name]
    deadline_s = time.monotonic() + DEADLINE_S
    with each_once(cluster, message_set) as tally:
        while tally.distinct() < message_set.count and time.monotonic() < deadline_s:
            stream(follower(cluster), message_set, tally, deadline_s)


def stream(node: LocalNode, message_set: MessageSet, tally: Tally, deadline_s: float) -> None:
    """One `Receive` stream through ``node``, until the set is whole, the stream fails or
    ``deadline_s``."""
    requests: queue.Queue[pb.ReceiveRequest | None] = queue.Queue()
    requests.put(pb.ReceiveRequest(subscribe=pb.Subscribe(
        topic=message_set.topic, group=STREAM, consumer="raw", credits=CREDITS)))
    with open_channel(node.grpc_address, node.credentials, CHANNEL_OPTIONS) as channel:
        call = pb_grpc.TickwheelStub(channel).Receive(
            iter(requests.get, None), timeout=max(0.0, deadline_s - time.monotonic()))
        try:
            for response in call:
                tally.got += [Got(m.id, len(m.body), m.attempt, m.possible_duplicate)
                              for m in response.messages]
                requests.put(pb.ReceiveRequest(ack=pb.Ack(
                    receipts=[m.receipt for m in response.messages])))
                requests.put(pb.ReceiveRequest(credit=pb.Credit(
                    credits=len(response.messages))))
                if tally.distinct() == message_set.count:
                    break
        except grpc.RpcError as error:
            tally.errors.append(f"{error.code().name} {error.details()}")
        finally:
            requests.put(None)
            call.cancel()


@pytest.mark.cluster
@pytest.mark.parametrize("name", SETS)
def test_receiving_without_a_stream_gets_each_message_once(cluster: LocalCluster,
                                                           name: str) -> None:
    """The client library's `receive`, asking 100 messages a call."""
    message_set = SETS[name]
    deadline_s = time.monotonic() + DEADLINE_S
    with each_once(cluster, message_set) as tally, cluster.client(timeout_s=30) as client:
        while tally.distinct() < message_set.count and time.monotonic() < deadline_s:
            try:
                batch = client.receive(message_set.topic, consumer="unary", group=RECEIVE,
                                       max_messages=CREDITS, wait_ms=1_000)
            except TickwheelClientError as error:
                tally.errors.append(repr(error))
                continue
            tally.got += [Got(m.id, len(m.body), m.attempt, m.possible_duplicate)
                          for m in batch]
            if batch:
                client.ack_receipts(message_set.topic, RECEIVE, [m.receipt for m in batch])


@pytest.mark.cluster
def test_a_rocketmq_simple_consumer_at_a_follower_gets_each_4_mib_message_once(
        cluster: LocalCluster) -> None:
    """RocketMQ 5's official Python client, unchanged, asking 16 messages a call (its
    example's batch) from a follower, which forwards each call to the leader."""
    message_set = SETS["4MiB"]
    node = follower(cluster)
    assert cluster.security is not None and node.rocketmq_address is not None
    config = {"endpoint": node.rocketmq_address, "access_key": "admin",
              "secret_key": cluster.rocketmq_secret_key("admin"), "topic": message_set.topic,
              "group": ROCKETMQ, "expect": message_set.count, "timeout_s": DEADLINE_S}
    with each_once(cluster, message_set) as tally:
        done = subprocess.run(
            [sys.executable, str(ROCKETMQ_DRIVER), "simple", json.dumps(config)],
            capture_output=True, text=True, timeout=DEADLINE_S + 30, check=False,
            env={**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cluster.security.ca_file)})
        assert done.returncode == 0, done.stderr[-3000:]
        for event in map(json.loads, done.stdout.splitlines()):
            if event["event"] == "received":
                tally.got.append(Got(event["id"], len(event["body"]), event["attempt"],
                                     event["flagged"]))
            elif event["event"] == "receive_failed":
                tally.errors.append(event["error"])


# -- the bound itself, without a cluster --------------------------------------------------------

LONGEST_NODE = "n" * 253 + ":65535"
"""A leader's Raft address (the ``node`` of each message) with the longest host name."""
CIPHER = HandleCipher(bytes(range(16)))


def sent_at_the_limits(index: int, body_bytes: int = 4 << 20) -> Sent:
    """A message with every field as large as validation and the wheel allow: an id of 256
    bytes and properties of 64 KiB, both in multi-byte characters, a dead-letter topic of
    254 characters, the largest numbers (the attempt within RocketMQ's int32)."""
    properties = {f"k{i:02}": "€" * 340 + "x" for i in range(64)}
    message = DueMessage(f"{index:04}" + "😀" * 63, "%DLQ%" + "t" * 249, b"x" * body_bytes,
                         properties, 2**62, 2**62 - 1 - index, 2**40, 2**31, 2**32 - 1)
    lease = LeaseRef(2**32 - 1, 2**62, 2**32 - 1, 2**64 - 1)
    return Sent(Delivery(message, 1, lease, True, 1), encode_receipt(lease), 2**31 - 1,
                2**62, properties)


def test_a_message_at_every_limit_takes_no_more_than_it_is_counted() -> None:
    sent = sent_at_the_limits(0)
    assert len(sent.delivery.message.id.encode()) == 256
    assert sum(len(k.encode()) + len(v.encode()) for k, v in sent.properties.items()) == 64 << 10
    response = receive_response([sent], "g" * 128, LONGEST_NODE, CIPHER)
    assert response.ByteSize() <= delivered_bytes(sent)
    # RocketMQ passes each message on in a response of its own, with fields of its own
    rocketmq = convert.to_rocketmq(response.messages[0], 30_000, LONGEST_NODE)
    assert rocketmq.ByteSize() <= delivered_bytes(sent) + ENVELOPE_BYTES


def test_responses_of_the_largest_messages_fit_what_nodes_send_and_clients_read() -> None:
    config = CourierConfig()
    batch = [sent_at_the_limits(index) for index in range(20)]
    responses = list(split(batch, config.max_batch_msgs, config.max_batch_bytes))
    assert [len(response) for response in responses] == [15, 5]
    assert [sent for response in responses for sent in response] == batch
    sent_limit = dict(forward.CHANNEL_OPTIONS)["grpc.max_send_message_length"]
    for response in responses:
        encoded = receive_response(response, "g" * 128, LONGEST_NODE, CIPHER).ByteSize()
        assert encoded <= config.max_batch_bytes
    # the listeners send with the forwarder's options; a follower reads its leader's
    # responses (a proxied stream, a forwarded ReceiveMessages) with them
    assert config.max_batch_bytes + ENVELOPE_BYTES <= sent_limit == GRPC_MESSAGE_BYTES
    assert dict(forward.CHANNEL_OPTIONS)["grpc.max_receive_message_length"] >= sent_limit
    assert dict(CHANNEL_OPTIONS)["grpc.max_receive_message_length"] >= sent_limit


def test_a_response_carries_one_message_at_least_and_max_msgs_at_most() -> None:
    small = [sent_at_the_limits(index, body_bytes=10) for index in range(600)]
    assert [len(batch) for batch in split(small, 256, 64 << 20)] == [256, 256, 88]
    large = [sent_at_the_limits(index) for index in range(3)]
    assert [len(batch) for batch in split(large, 256, 1 << 20)] == [1, 1, 1]
    assert fitting(large, 256, 2 * delivered_bytes(large[0])) == 2
    assert fitting([], 256, 1 << 20) == 0
