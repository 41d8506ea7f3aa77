"""The delivery trail is formatted by hand for speed; every line must still be the JSON the
audit expects, whatever the id holds."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tickwheel.client import Message
from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.node.delivery.sent import Sent
from tickwheel.node.delivery.trail import DeliveryTrail, files
from tickwheel.replication.commands import LeaseRef
from tickwheel.replication.dispatcher import Delivery
from tickwheel.wheel import Cursor
from tickwheel.wheel.types import DueMessage


@given(ids=st.lists(st.text(max_size=40), min_size=1, max_size=5),
       duplicate=st.booleans(), attempt=st.integers(1, 1_000),
       group=st.from_regex(r"[A-Za-z0-9._-]{0,12}", fullmatch=True))
def test_delivered_lines_are_the_json_of_each_event(tmp_path_factory, ids: list[str],
                                                    duplicate: bool, attempt: int,
                                                    group: str) -> None:
    path: Path = tmp_path_factory.mktemp("trail") / "deliveries.jsonl"
    trail = DeliveryTrail(path, 'node "a"')
    messages = [DueMessage(id_, "orders.eu-1", b"x", {}, 1_700_000_000_000 + i, 40 + i,
                           1_700_000_000 + i, i) for i, id_ in enumerate(ids)]
    trail.delivered([Sent(Delivery(m, 9, LeaseRef(1, m.handle, 2, 77), duplicate, 3),
                            "receipt", attempt, 1_700_000_000_123, {}) for m in messages],
                      group, 7)
    trail.dispatch_started(8, 4, Cursor(1_700_000_001, 2), 1_700_000_001_000)
    trail.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[:-1] == [{
        "event": "delivered", "node": 'node "a"', "term": 7, "group": group, "epoch": 3,
        "id": m.id, "lease": 2,
        "topic": "orders.eu-1", "handle": m.handle, "deliver_at_ms": m.deliver_at_ms,
        "delivered_at_ms": 1_700_000_000_123, "position": [m.slot_second, m.local_index],
        "possible_duplicate": duplicate, "attempt": attempt} for m in messages]
    assert lines[-1]["event"] == "dispatch_started"


def _batch(first: int, count: int) -> list[Sent]:
    return [Sent(Delivery(DueMessage(f"id-{i}", "orders", b"x", {}, 1_700_000_000_000 + i,
                                     i, 1_700_000_000, i), 9, LeaseRef(1, i, 1, 77), False, 3),
                 "receipt", 1, 1_700_000_000_123, {}) for i in range(first, first + count)]


def test_the_trail_rotates_and_never_holds_more_than_its_bound(tmp_path: Path) -> None:
    """A node that runs for months must not fill its disk with evidence: the trail and
    the one file it rotated out stay under ``max_bytes`` (plus one batch), and what they
    keep is the latest stretch, whole lines, in order."""
    path = tmp_path / "deliveries.jsonl"
    trail = DeliveryTrail(path, "n0", max_bytes=16_384)
    for start in range(0, 2_000, 20):
        trail.delivered(_batch(start, 20), "", 1)
        on_disk = sum(p.stat().st_size for p in files(tmp_path))
        assert on_disk <= 16_384 + 20 * 400, on_disk
    trail.close()
    assert files(tmp_path) == [path.with_name("deliveries.jsonl.1"), path]
    ids = [json.loads(line)["id"] for p in files(tmp_path) for line in p.read_text().splitlines()]
    assert ids == [f"id-{i}" for i in range(2_000 - len(ids), 2_000)]
    assert 16_384 // 2 // 400 < len(ids) < 2_000


def test_a_trail_of_zero_bytes_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "deliveries.jsonl"
    trail = DeliveryTrail(path, "n0", max_bytes=0)
    trail.delivered(_batch(0, 5), "", 1)
    trail.dispatch_started(1, 1, Cursor(1, 0), 1)
    trail.close()
    assert files(tmp_path) == []


@pytest.mark.cluster
def test_a_node_keeps_its_trail_under_trail_max_bytes(tmp_path: Path) -> None:
    """The setting reaches the node: a real one, given 8 KiB, rotates its trail while it
    delivers 300 messages (ten requests of 30) and keeps the latest of them within the
    bound."""
    with LocalCluster(tmp_path, 1, ("--trail-max-bytes", "8192")) as cluster:
        cluster.leader()
        arrived: list[str] = []
        with cluster.client(timeout_s=30) as client, AckingConsumer(
                cluster, "bounded", on_message=lambda m: arrived.append(m.id)):
            for start in range(0, 300, 30):
                client.schedule_many(Message("bounded", b"x", delay_ms=0, id=f"m-{i}")
                                     for i in range(start, start + 30))
                wait_for(lambda end=start + 30: len(arrived) >= end, 30, "the deliveries")
        path = cluster.nodes[0].data / "deliveries.jsonl"
        kept = files(cluster.nodes[0].data)
        assert kept == [path.with_name("deliveries.jsonl.1"), path]
        assert sum(p.stat().st_size for p in kept) <= 8192 + 30 * 400
        ids = [event["id"] for event in cluster.nodes[0].trail() if "id" in event]
        assert 0 < len(ids) < 300 and ids[-1] == arrived[-1]
