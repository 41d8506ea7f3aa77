"""A backlog of one topic, due before everything else, on a real 3-node cluster: the other
topics' messages due meanwhile go out when due, not after the backlog (each dispatch step
gives every topic its share first: `tickwheel.wheel.shares`); the Raft thread's steps are
exported while it drains."""

from __future__ import annotations

import re
import threading
import urllib.request
from pathlib import Path

import pytest
from nodetests import now_ms

from tickwheel.client import Client, Message
from tickwheel.harness.local_cluster import LocalCluster, wait_for

pytestmark = pytest.mark.cluster

BACKLOG = 90_000
"""Messages of one topic due at one time, read by nobody: each step readies its share of
them (at most `max_ready_msgs`, 100,000, are kept), which takes seconds on a small host."""
SMALL_TOPICS = 5
SMALL_MSGS = 6


def _backlog_readied(client: Client) -> int:
    return sum(group.ready for group in client.cluster_info().groups if group.topic == "big")


def _read(client: Client, name: str, lateness: dict[str, list[int]],
          backlog_readied: dict[str, int]) -> None:
    with client.consume(name) as consumer:
        for message in consumer:
            lateness[name].append(now_ms() - message.deliver_at_ms)
            message.ack()
            if len(lateness[name]) == SMALL_MSGS:
                backlog_readied[name] = _backlog_readied(client)
                return


def test_small_topics_are_served_beside_a_backlog_due_before_them(tmp_path: Path) -> None:
    """Before: a step took what was due in dispatch order, so the small topics' messages,
    due after the backlog's time, waited until every message of the backlog was readied."""
    with LocalCluster(tmp_path, metrics=True) as cluster, \
            cluster.client(timeout_s=60) as client:
        cluster.leader(30)
        due_ms = now_ms() + 8_000
        for start in range(0, BACKLOG, 1_000):
            client.schedule_many([Message("big", b"x" * 100, deliver_at_ms=due_ms,
                                          id=f"b{i}") for i in range(start, start + 1_000)])
        names = [f"small-{k}" for k in range(SMALL_TOPICS)]
        client.schedule_many(Message(name, b"s", deliver_at_ms=due_ms + 50 + 50 * i,
                                     id=f"{name}-{i}")
                             for name in names for i in range(SMALL_MSGS))
        lateness: dict[str, list[int]] = {name: [] for name in names}
        backlog_readied: dict[str, int] = {}
        readers = [threading.Thread(target=_read, args=(client, name, lateness,
                                                        backlog_readied)) for name in names]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(60)
        wait_for(lambda: _backlog_readied(client) == BACKLOG, 60, "the backlog to be readied")
        steps = [urllib.request.urlopen(f"http://{node.metrics_address}/metrics",
                                        timeout=5).read().decode() for node in cluster.nodes]
    assert all(len(got) == SMALL_MSGS for got in lateness.values()), lateness
    # each small topic was read whole while most of the backlog still waited in the wheel
    assert all(readied < BACKLOG // 2 for readied in backlog_readied.values()), backlog_readied
    assert max(max(got) for got in lateness.values()) < 2_000, lateness
    for text in steps:  # every node measured its Raft thread's steps
        count = re.search(r"^tickwheel_raft_step_seconds_count (\S+)$", text, re.M)
        assert count is not None and float(count.group(1)) > 0
        assert re.search(r"^tickwheel_raft_step_longest_seconds \S+$", text, re.M)
