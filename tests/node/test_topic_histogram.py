"""``DueHistogram`` of one topic on a real 3-node cluster, through the client library: two
topics' messages counted apart, exact after a schedule, a cancel and a reschedule, the same on
every member; a message leaves its topic's counts once handed out and passed by the cursor;
a topic is asked for only with a grant on it, and a name that is no topic's is refused naming
the field."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tickwheel.client import Client, InvalidArgument, Message, PermissionDenied
from tickwheel.harness.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

MINUTE_MS, HOUR_MS = 60_000, 3_600_000
ORDERS, REFUNDS, SECRET = "topic-histogram-orders", "topic-histogram-refunds", "th-secret"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("topic-histogram")), principals={
            "orders": [{"actions": ["schedule"], "topics": [ORDERS]}]}) as cluster:
        cluster.leader(timeout_s=30)
        yield cluster


def at(counts: tuple[int, ...], start_ms: int, base_ms: int, bucket_ms: int,
       buckets: list[int]) -> list[int]:
    """The counts of ``buckets`` numbered from ``base_ms`` in an answer starting at
    ``start_ms`` (a bucket may have begun between two answers)."""
    shift = (start_ms - base_ms) // bucket_ms
    return [counts[b - shift] for b in buckets]


def test_two_topics_counted_apart_through_schedule_cancel_reschedule(
        cluster: LocalCluster) -> None:
    with cluster.client() as admin:
        base_ms = admin.due_histogram("hour", topic=ORDERS).start_ms
        orders = [s.handle for s in admin.schedule_many(
            [Message(ORDERS, "o", deliver_at_ms=base_ms + m * MINUTE_MS + 30_000)
             for m in (5, 5, 7, 20)])]
        refunds = [s.handle for s in admin.schedule_many(
            [Message(REFUNDS, "r", deliver_at_ms=base_ms + m * MINUTE_MS + 30_000)
             for m in (5, 9)])]
        minutes = [5, 7, 9, 20, 40]

        def counts(topic: str) -> list[int]:
            answer = admin.due_histogram("hour", topic=topic)
            assert answer.topic == topic and answer.overdue == 0
            return at(answer.counts, answer.start_ms, base_ms, MINUTE_MS, minutes)

        assert (counts(ORDERS), counts(REFUNDS)) == ([2, 1, 0, 1, 0], [1, 0, 1, 0, 0])
        admin.cancel_outcomes(orders[:1])
        admin.reschedule(refunds[1:], deliver_at_ms=base_ms + 40 * MINUTE_MS + 30_000)
        assert (counts(ORDERS), counts(REFUNDS)) == ([1, 1, 0, 1, 0], [1, 0, 0, 0, 1])
        day = admin.due_histogram("day", topic=ORDERS)
        assert sum(day.counts) + day.overdue + day.beyond == 3
        year = admin.due_histogram("year", topic=REFUNDS)
        assert sum(year.counts) + year.overdue + year.beyond == 2
        assert sum(admin.due_histogram("day", topic="topic-histogram-none").counts) == 0
        wanted = {topic: admin.due_histogram("day", topic=topic).counts
                  for topic in (ORDERS, REFUNDS)}
    deadline = time.monotonic() + 10
    for node in cluster.nodes:
        with Client(node.grpc_address, credentials=cluster.credentials()) as one:
            for topic, counted in wanted.items():
                while one.due_histogram("day", topic=topic).counts != counted:
                    assert time.monotonic() < deadline, f"{node.grpc_address} differs"
                    time.sleep(0.05)


def test_a_message_leaves_its_topic_once_the_cursor_passes_it(cluster: LocalCluster) -> None:
    topic = "topic-histogram-soon"
    with cluster.client() as admin:
        admin.schedule(topic, "soon", delay_ms=2_000)
        admin.schedule(topic, "later", delay_ms=2 * HOUR_MS)

        def live() -> int:
            answer = admin.due_histogram("day", topic=topic)
            return sum(answer.counts) + answer.overdue + answer.beyond

        assert live() == 2
        deadline = time.monotonic() + 30
        while live() != 1:  # handed out to its (no) groups, then passed by the cursor
            assert time.monotonic() < deadline, "the due message is still counted"
            time.sleep(0.1)


def test_a_topic_is_counted_only_for_a_principal_with_a_grant(cluster: LocalCluster) -> None:
    with cluster.client() as admin:
        admin.schedule(SECRET, "s", delay_ms=HOUR_MS)
        admin.schedule(ORDERS, "o", delay_ms=HOUR_MS)
        assert sum(admin.due_histogram("day", topic=SECRET).counts) >= 1
    with cluster.client("orders") as orders:
        assert sum(orders.due_histogram("day", topic=ORDERS).counts) >= 1
        with pytest.raises(PermissionDenied, match="th-secret"):
            orders.due_histogram("day", topic=SECRET)
        with pytest.raises(InvalidArgument) as refused:
            orders.due_histogram("day", topic="no such topic")
        assert refused.value.field == "topic"
