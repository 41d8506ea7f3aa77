"""What a client can make a node write or hold: log lines, metric series, request bytes
(issue 17). A real node started as users start it (`LocalCluster`), attacked over its public
gRPC API.

Measured on the first release: a newline in ``Subscribe.consumer`` forged a ``CRITICAL
replica_fatal`` line, an 8 MiB name wrote two 8 MiB log lines, 100,000 made-up topic names
left 100,005 series in ``/metrics`` that were never removed, and 8 concurrent 56 MiB requests
(all refused) took a node past its pod's 1 GiB limit.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tickwheel.client import Client, Message, RequestTooLarge
from tickwheel.client.credentials import open_aio_channel, open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cluster

MAX_TOPIC_LABELS = 50
FORGED = "2026-11-23 23:59:59,000 CRITICAL tickwheel.replication event=replica_fatal forged=1"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    with LocalCluster(tmp_path_factory.mktemp("edges"), size=1, metrics=True,
                      extra_args=("--max-topic-labels", str(MAX_TOPIC_LABELS))) as cluster:
        yield cluster.leader(timeout_s=30)


def subscribe(stub: pb_grpc.TickwheelStub, **fields: object) -> Iterator[pb.ReceiveResponse]:
    """A `Receive` stream whose requests stay open (until the call is cancelled)."""
    closed = threading.Event()

    def requests() -> Iterator[pb.ReceiveRequest]:
        yield pb.ReceiveRequest(subscribe=pb.Subscribe(**fields))
        closed.wait(30)

    call = stub.Receive(requests(), timeout=30)
    call.add_done_callback(lambda _: closed.set())
    return call


def forged_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines()
            if line.startswith(FORGED[:20]) and "forged=1" in line]


def test_a_consumer_name_cannot_forge_or_flood_log_lines(node: LocalNode) -> None:
    size_before = node.log_path.stat().st_size
    for name in (f"x\n{FORGED}", "y" * (1 << 20)):
        with pytest.raises(grpc.RpcError) as raised:
            next(subscribe(node.stub, topic="orders", credits=1, consumer=name))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "subscribe.consumer" in raised.value.details()
    with pytest.raises(grpc.RpcError) as raised:  # 8 MiB: above what the node reads at all
        next(subscribe(node.stub, topic="orders", credits=1, consumer="z" * (8 << 20)))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert forged_lines(node.log_path) == []
    assert node.log_path.stat().st_size - size_before < 10_000


def test_a_message_id_is_escaped_in_every_log_line(node: LocalNode) -> None:
    message_id = f"m-{time.time_ns()}\n{FORGED}"
    node.stub.Schedule(pb.ScheduleRequest(messages=[pb.Message(
        id=message_id, topic="escaped", body=b"x", deliver_at_ms=int(time.time() * 1000))]),
        timeout=10)
    responses = subscribe(node.stub, topic="escaped", credits=1, visibility_timeout_ms=100,
                          consumer="never-acks")
    assert next(responses).messages[0].id == message_id  # and never acknowledged
    wait_for(lambda: "event=visibility_timeout topic=escaped" in node.log_path.read_text(),
             30, "the visibility timeout to be logged")
    responses.cancel()
    assert forged_lines(node.log_path) == []
    assert repr(message_id) in node.log_path.read_text()


def consumers_series(text: str) -> dict[str, float]:
    """``tickwheel_consumers`` by topic label, from a ``/metrics`` page."""
    series = {}
    for line in text.splitlines():
        if line.startswith('tickwheel_consumers{topic="'):
            label, value = line[len('tickwheel_consumers{topic="'):].rsplit('"} ', 1)
            series[label] = float(value)
    return series


def test_made_up_topic_names_do_not_grow_metrics(node: LocalNode) -> None:
    topics = [f"made-up-{i}" for i in range(5 * MAX_TOPIC_LABELS)]

    def metrics() -> str:
        with urllib.request.urlopen(f"http://{node.metrics_address}/metrics",
                                    timeout=5) as response:
            return response.read().decode()

    def streams_counted() -> dict[str, float] | None:
        series = consumers_series(metrics())
        counted = sum(value for label, value in series.items()
                      if label.startswith("made-up-") or label == "%other%")
        return series if counted == len(topics) else None

    async def hold_streams() -> dict[str, float]:
        async with open_aio_channel(node.grpc_address, node.credentials, ()) as channel:
            stub = pb_grpc.TickwheelStub(channel)
            calls = []
            for topic in topics:
                call = stub.Receive(metadata=node.credentials.call_metadata())
                await call.write(pb.ReceiveRequest(subscribe=pb.Subscribe(topic=topic,
                                                                         credits=1)))
                calls.append(call)
            try:
                return await asyncio.to_thread(wait_for, streams_counted, 30,
                                               "every stream counted")
            finally:
                for call in calls:
                    call.cancel()

    series = asyncio.run(hold_streams())
    assert len(series) <= MAX_TOPIC_LABELS + 1, len(series)
    assert series["%other%"] >= len(topics) - MAX_TOPIC_LABELS
    wait_for(lambda: "made-up-" not in metrics(), 30, "closed streams to leave /metrics")
    assert len(metrics()) < 64_000


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def test_eight_concurrent_56_mib_requests_cost_under_32_mb(node: LocalNode) -> None:
    """The first release read each of them whole before refusing it: 67 -> 678 MB, kept."""
    body = b"x" * (4 << 20)
    request = pb.ScheduleRequest(messages=[pb.Message(
        id=f"big-{i}", topic="bad topic!", body=body, deliver_at_ms=int(time.time() * 1000))
        for i in range(14)])
    assert request.ByteSize() > 56 << 20
    before_mb = rss_mb(node.pid)
    codes: list[grpc.StatusCode] = []

    def send() -> None:
        with open_channel(node.grpc_address, node.credentials, (
                ("grpc.max_send_message_length", 128 << 20),)) as channel:
            try:
                pb_grpc.TickwheelStub(channel).Schedule(request, timeout=60)
            except grpc.RpcError as error:
                codes.append(error.code())
    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 8
    grown_mb = rss_mb(node.pid) - before_mb
    assert grown_mb < 32, f"RSS grew by {grown_mb:.0f} MB"


def test_the_client_library_says_a_batch_is_too_large_at_once(node: LocalNode) -> None:
    messages = [Message(topic="orders", body=b"x" * (4 << 20), delay_ms=60_000)
                for _ in range(3)]
    started = time.monotonic()
    with Client(node.grpc_address, timeout_s=30, credentials=node.credentials) as client, \
            pytest.raises(RequestTooLarge, match="split"):
        client.schedule_many(messages)
    assert time.monotonic() - started < 5  # refused for good, not retried for 30 s
