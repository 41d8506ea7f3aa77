"""A consumer stream that never reads (issue 17): what it can make the leader hold.

Measured on the first release: a stream that took messages and never read its responses
pinned every body sent to it, retries included, in an unbounded outbox (592 -> 946 MB,
never released). Now a stream holds only messages leased to it, a group's leases stop at its
in-flight budget (``max_inflight_bytes``), and a stream whose messages wait unsent past their
visibility timeout is closed and its messages go to its group's other consumers
(``event=consumer_stalled``). On the build before this the hoarder was never closed: its
expired messages were granted to it again and again, each copy queued behind the response it
never read. A real node started as users start it, attacked over its public gRPC API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tickwheel.client import Client, Message
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cluster

BUDGET = 16 << 20
"""The group's in-flight bytes (``--max-inflight-bytes``)."""
BODY = 256 << 10
COUNT = 640
"""160 MiB due at once: ten budgets."""
VISIBILITY_MS = 2_000
GROWTH_LIMIT_MB = 112
"""What the hoarder may make the leader hold: its group's budget (16 MiB), the response being
written to it, the bodies the leader keeps of ready messages (at most 64 MiB,
`tickwheel.replication.handout`) and the allocator's slack; not the 160 MiB it asked for."""
TOPIC = "hoard"
HOARDERS, WATCHERS = "hoarders", "watchers"
"""Two groups of the topic: each gets its own copy of every message."""


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def group_info(client: Client, group: str) -> pb.GroupInfo:
    found = [info for info in client.cluster_info().groups
             if info.topic == TOPIC and info.group == group]
    return found[0] if found else pb.GroupInfo()


def hoard(stub: pb_grpc.TickwheelStub, stop: threading.Event) -> grpc.Future:
    """Subscribe with every credit allowed, and never read a response."""
    def requests() -> Iterator[pb.ReceiveRequest]:
        yield pb.ReceiveRequest(subscribe=pb.Subscribe(
            topic=TOPIC, group=HOARDERS, credits=10_000, consumer="never-reads",
            visibility_timeout_ms=VISIBILITY_MS))
        stop.wait(120)

    return stub.Receive(requests(), timeout=120)


def received_ids(client: Client, group: str, count: int) -> set[str]:
    ids: set[str] = set()
    with client.consume(TOPIC, group=group, prefetch=16) as consumer:
        timer = threading.Timer(60, consumer.close)
        timer.start()
        try:
            for message in consumer:
                ids.add(message.id)
                message.ack()
                if len(ids) == count:
                    break
        finally:
            timer.cancel()
    return ids


def test_a_stream_that_never_reads_holds_its_groups_budget_then_is_closed(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, extra_args=(
            "--max-inflight-bytes", str(BUDGET))) as cluster:
        node = cluster.leader(timeout_s=30)
        with cluster.client(timeout_s=30) as client:
            for group in (HOARDERS, WATCHERS):
                client.create_group(TOPIC, group)
            due_ms = time.time_ns() // 1_000_000
            ids = [f"m-{i:04}" for i in range(COUNT)]
            for start in range(0, COUNT, 16):
                client.schedule_many([Message(topic=TOPIC, body=b"x" * BODY, id=message_id,
                                              deliver_at_ms=due_ms)
                                      for message_id in ids[start:start + 16]])
            wait_for(lambda: group_info(client, HOARDERS).ready == COUNT, 30,
                     "every message due")
            before_mb = rss_mb(node.pid)
            stop = threading.Event()
            with open_channel(node.grpc_address, node.credentials, ()) as channel:
                call = hoard(pb_grpc.TickwheelStub(channel), stop)
                try:
                    held = wait_for(lambda: (info := group_info(client, HOARDERS)).leased
                                    * BODY >= BUDGET - BODY and info, 30,
                                    "the hoarder to reach its group's budget")
                    assert held.leased * BODY <= BUDGET + BODY, held
                    grown_mb = rss_mb(node.pid) - before_mb
                    assert grown_mb < GROWTH_LIMIT_MB, f"RSS grew by {grown_mb:.0f} MB"
                    # other groups go on while it hoards
                    assert received_ids(client, WATCHERS, COUNT) == set(ids)
                    wait_for(lambda: "event=consumer_stalled" in node.log_path.read_text(),
                             VISIBILITY_MS / 1000 + 10, "the hoarder to be closed")
                    # its messages come back to its group, while its connection stays open
                    assert received_ids(client, HOARDERS, COUNT) == set(ids)
                    assert not call.done()
                    # nothing stays leased to it, so nothing of it stays pinned
                    left = group_info(client, HOARDERS)
                    assert (left.leased, left.ready, left.consumers) == (0, 0, 0), left
                finally:
                    stop.set()
                    call.cancel()
