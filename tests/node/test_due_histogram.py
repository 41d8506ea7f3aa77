"""``DueHistogram`` on a real 3-node cluster, through the client library: every member
answers the same counts from its own replicated state, a cancel and a reschedule show at once,
and the topics' pending totals follow the caller's grants."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tickwheel.client import Client, InvalidArgument, Message
from tickwheel.harness.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

TOPIC = "histogram-orders"


@pytest.fixture(scope="module")
def grants_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("histogram")), principals={
            "orders": [{"actions": ["schedule"], "topics": [TOPIC]}]}) as cluster:
        cluster.leader(timeout_s=30)
        yield cluster


def test_counts_by_due_time_cancels_and_reschedules(grants_cluster: LocalCluster) -> None:
    with grants_cluster.client() as admin:
        start = admin.due_histogram("hour")
        assert (len(start.counts), start.bucket_ms) == (60, 60_000)
        base_ms = start.start_ms
        handles = [s.handle for s in admin.schedule_many(
            [Message(TOPIC, "x", deliver_at_ms=base_ms + minute * 60_000 + 30_000)
             for minute in (5, 5, 5, 7, 20)])]
        answer = admin.due_histogram("hour")
        shift = (answer.start_ms - base_ms) // 60_000  # a minute may have begun meanwhile
        counts = [answer.counts[m - shift] - start.counts[m] for m in (5, 7, 20)]
        assert counts == [3, 1, 1]
        admin.cancel_outcomes(handles[:1])
        admin.reschedule(handles[3:4], deliver_at_ms=base_ms + 40 * 60_000 + 30_000)
        after = admin.due_histogram("hour")
        shift = (after.start_ms - base_ms) // 60_000
        assert [after.counts[m - shift] - start.counts[m] for m in (5, 7, 20, 40)] == [
            2, 0, 1, 1]
        day = admin.due_histogram("day")
        assert len(day.counts) == 24 and sum(day.counts) + day.overdue + day.beyond >= 4
        assert len(admin.due_histogram("year").counts) == 366
        with pytest.raises(InvalidArgument):
            admin.due_histogram("week")


def test_every_member_answers_from_its_own_state(grants_cluster: LocalCluster) -> None:
    with grants_cluster.client() as admin:
        admin.schedule(TOPIC, "y", delay_ms=3 * 3_600_000)
        wanted = admin.due_histogram("day").counts
    deadline = time.monotonic() + 10
    for node in grants_cluster.nodes:
        with Client(node.grpc_address, credentials=grants_cluster.credentials()) as one:
            while one.due_histogram("day").counts != wanted:
                assert time.monotonic() < deadline, f"{node.grpc_address} does not catch up"
                time.sleep(0.05)


def test_pending_totals_follow_the_grants(grants_cluster: LocalCluster) -> None:
    with grants_cluster.client() as admin:
        admin.schedule("histogram-secret", "z", delay_ms=600_000)
        assert "histogram-secret" in {p.topic for p in admin.due_histogram().pending}
    with grants_cluster.client("orders") as orders:
        assert {p.topic for p in orders.due_histogram().pending} <= {TOPIC}
