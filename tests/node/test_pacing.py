"""A burst larger than a group may keep ready, on a real 3-node cluster: readied as fast as its
consumer takes it, so nothing is dropped, and another topic's messages due meanwhile go out
on time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from nodetests import now_ms

from tickwheel.client import Client, Message
from tickwheel.harness.local_cluster import LocalCluster, wait_for

pytestmark = pytest.mark.cluster

MAX_READY = 2_000
BURST = 12_000
CONSUMER_RATE = 2_000
"""Messages a second the burst's consumer takes at most: slower than the leader readies."""


def consume_paced(client: Client, name: str, count: int, rate: float,
                  received: list[Message]) -> None:
    """Take ``count`` distinct messages of ``name``, acking each, at most ``rate`` a second."""
    began, seen = 0.0, set()
    with client.consume(name, prefetch=100) as consumer:
        for message in consumer:
            began = began or time.monotonic()
            received.append(message)
            message.ack()
            seen.add(message.id)
            if len(seen) == count:
                return
            ahead_s = len(received) / rate - (time.monotonic() - began)
            if ahead_s > 0:
                time.sleep(ahead_s)  # a slow consumer, not a wait for something to happen


def test_a_burst_is_readied_as_its_consumer_takes_it_and_the_other_topics_go_on(
        tmp_path: Path) -> None:
    """Before: a group kept max_ready_msgs ready and dropped its oldest past it, consumers or
    not, so a burst due at once larger than that lost messages its consumer was reading; and
    every other topic's messages due during a burst waited behind it."""
    with LocalCluster(tmp_path, extra_args=("--max-ready-msgs", str(MAX_READY))) as cluster, \
            cluster.client(timeout_s=60) as client:
        cluster.leader(30)
        due_ms = now_ms() + 3_000
        for start in range(0, BURST, 1_000):
            client.schedule_many([Message("burst", b"x" * 100, deliver_at_ms=due_ms,
                                          id=f"b{i}") for i in range(start, start + 1_000)])
        received: list[Message] = []
        reader = threading.Thread(target=consume_paced,
                                  args=(client, "burst", BURST, CONSUMER_RATE, received))
        reader.start()
        wait_for(lambda: now_ms() >= due_ms + 500, 10, "the burst to be half a second due")
        steady = [Message("steady", b"s", deliver_at_ms=now_ms() + 300 + 100 * i, id=f"s{i}")
                  for i in range(20)]
        client.schedule_many(steady)
        lateness = []
        with client.consume("steady") as consumer:
            for message in consumer:
                lateness.append(now_ms() - message.deliver_at_ms)
                message.ack()
                if len(lateness) == len(steady):
                    break
        burst_left = BURST - len({m.id for m in received})
        reader.join(60)
    assert burst_left > BURST // 4  # the steady topic was read while the burst went on
    assert max(lateness) < 1_000, lateness  # not behind the burst
    ids = [m.id for m in received]
    assert sorted(set(ids)) == sorted(f"b{i}" for i in range(BURST))
    assert len(ids) == BURST and not any(m.possible_duplicate for m in received)
