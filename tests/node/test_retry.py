"""Delay levels, consumer retry and dead letters end to end, on 3-node clusters of real
``tickwheel serve`` processes (RocketMQ's semantics, seeds 001 and 002)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodetests import now_ms, topic

from tickwheel.client import Client, Consumer, Message, Received
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.node.delivery.levels import DEFAULT_LEVELS, parse_levels

pytestmark = pytest.mark.cluster

HOUR_MS = 3_600_000
LADDER_LEVELS_MS = (1_000, 2_000, 3_000)
LADDER = ("--delay-levels", "1s 2s 3s", "--retry-start-level", "1", "--max-attempts", "4")
"""A ladder short enough to wait for: a nack of attempt k waits k seconds; attempt 4 is the
last."""




def client_of(cluster: LocalCluster) -> Client:
    return cluster.client(timeout_s=60)


def until_seen(consumer: Consumer, ids: set[str]) -> list[Received]:
    """Acknowledge everything until each of ``ids`` has arrived; returns what arrived."""
    got: list[Received] = []
    missing = set(ids)
    for message in consumer:
        got.append(message)
        message.ack()
        missing.discard(message.id)
        if not missing:
            return got
    raise AssertionError(f"the stream ended before {sorted(missing)} arrived")


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("ladder"), extra_args=LADDER) as started:
        started.leader()
        yield started


def test_every_delay_level_on_the_real_and_on_a_skewed_clock_and_clamping(
        tmp_path: Path) -> None:
    table = parse_levels(DEFAULT_LEVELS)
    asked = [*range(1, table.max_level + 1), 19, 1_000]
    name = topic("r")
    with LocalCluster(tmp_path) as cluster, client_of(cluster) as client:
        cluster.leader()
        before_ms = now_ms()
        results = client.schedule_many([Message(name, f"level {level}", delay_level=level,
                                                id=f"L{level}") for level in asked])
        after_ms = now_ms()
        due_ms = {}
        for level, result in zip(asked, results, strict=True):
            delay_ms, used = table.delay_ms(level)
            assert before_ms + delay_ms <= result.deliver_at_ms <= after_ms + delay_ms, level
            assert result.clamped_delay_level == (0 if used == level else table.max_level)
            due_ms[result.id] = result.deliver_at_ms
        # levels 1 and 2 (1 s, 5 s) on the real clock
        with client.consume(name) as consumer:
            short = until_seen(consumer, {"L1", "L2"})
        assert [(m.id, m.deliver_at_ms) for m in short] == [("L1", due_ms["L1"]),
                                                            ("L2", due_ms["L2"])]
        assert all(m.delivered_at_ms >= m.deliver_at_ms for m in short)
        # the rest (10 s to 2 h): every node restarted with its clock 2 h and a minute ahead
        for node in cluster.nodes:
            cluster.stop(node)
        for node in cluster.nodes:
            cluster.start(node, clock_skew_ms=2 * HOUR_MS + 60_000)
        cluster.leader(timeout_s=30)
        with client.consume(name, prefetch=64) as consumer:
            rest = until_seen(consumer, set(due_ms) - {"L1", "L2"})
    late = {m.id: m for m in rest if m.id not in ("L1", "L2")}  # L1, L2 may come again, flagged
    assert {i: m.deliver_at_ms for i, m in late.items()} == {
        i: due for i, due in due_ms.items() if i not in ("L1", "L2")}
    assert all(m.delivered_at_ms >= m.deliver_at_ms and m.attempt == 1 for m in late.values())
    assert all(m.possible_duplicate for m in rest if m.id in ("L1", "L2"))


def test_nacks_climb_the_ladder_a_visibility_timeout_counts_and_the_last_goes_to_the_dlq(
        ladder: LocalCluster) -> None:
    name = topic("r")
    with client_of(ladder) as client:
        client.schedule(name, b"poison", delay_ms=0, id="poison", properties={"k": "v"})
        seen: list[Received] = []
        with client.consume(name, visibility_timeout_ms=500) as consumer:
            for message in consumer:
                seen.append(message)
                if message.attempt != 2:  # attempt 2 is left to its visibility timeout
                    message.nack()
                if message.attempt == 4:
                    break
        with client.consume(f"%DLQ%{name}") as dead_letters:
            dead = next(dead_letters)
            dead.ack()
    assert [(m.id, m.attempt, m.body, m.properties) for m in seen] == [
        ("poison", attempt, b"poison", {"k": "v"}) for attempt in (1, 2, 3, 4)]
    waited_ms = [LADDER_LEVELS_MS[0], 500 + LADDER_LEVELS_MS[1], LADDER_LEVELS_MS[2]]
    for earlier, later, wait_ms in zip(seen[:-1], seen[1:], waited_ms, strict=True):
        assert wait_ms <= later.deliver_at_ms - earlier.delivered_at_ms < wait_ms + 2_000
        assert later.delivered_at_ms >= later.deliver_at_ms
    assert len({m.handle for m in seen}) == 4  # each retry is a copy of its own
    assert (dead.topic, dead.id, dead.attempt, dead.body, dead.properties) == (
        f"%DLQ%{name}", "poison", 5, b"poison", {"k": "v"})
    assert 0 <= dead.deliver_at_ms - seen[-1].delivered_at_ms < 2_000


def test_a_nack_across_a_leader_kill_gives_each_message_back_once(tmp_path: Path) -> None:
    name = topic("r")
    ids = {f"n-{i}" for i in range(40)}
    with LocalCluster(tmp_path, extra_args=LADDER) as cluster, client_of(cluster) as client:
        old = cluster.leader()
        client.schedule_many([Message(name, b"x", delay_ms=0, id=i) for i in sorted(ids)])
        consumer = client.consume(name, prefetch=100, visibility_timeout_ms=60_000)
        first = [next(consumer) for _ in ids]
        for message in first[:20]:
            message.nack()
        wait_for(lambda: old.log_path.read_text().count("event=message_retried") >= 20, 10,
                 "the old leader to apply the first 20 retries")
        for message in first[20:]:
            message.nack()
        cluster.signal(old, signal.SIGKILL)
        # The first 20 were retried before the kill: only their copies come back. Each of the
        # others is either still in flight (the new leader sends it again, flagged, and it is
        # nacked again: the nack repeated across the failover) or already retried.
        retried_before = {m.id for m in first[:20]}
        copies: Counter[str] = Counter()
        marker_due_ms = None
        for message in consumer:
            if message.id == "marker":
                message.ack()
                break
            if message.attempt == 1:
                assert message.possible_duplicate and message.id not in retried_before, message
                message.nack()
                continue
            assert message.attempt == 2, message
            copies[message.id] += 1
            message.ack()
            if set(copies) == ids and marker_due_ms is None:
                # any second copy would be due within a ladder step of a nack made by now
                marker_due_ms = now_ms() + 2 * LADDER_LEVELS_MS[0]
                client.schedule(name, b"m", deliver_at_ms=marker_due_ms, id="marker")
        consumer.close()
    assert {m.id for m in first} == ids
    assert copies == Counter(ids)  # one copy each: never neither, never two


def test_the_cli_schedules_by_level_nacks_and_reads_the_dead_letter_topic(
        ladder: LocalCluster) -> None:
    target = ",".join(node.grpc_address for node in ladder.nodes)
    name = topic("r")

    def tickwheel(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tickwheel.node", *args, "--target",
                               target], check=False, capture_output=True, text=True,
                              timeout=60, env={**os.environ, **ladder.security.environment(),
                                   "COLUMNS": "200"})
    scheduled = tickwheel("schedule", "--topic", name, "--level", "9", "--body", "cli")
    assert scheduled.returncode == 0, scheduled.stdout + scheduled.stderr
    assert "(level clamped to 3, the last)" in scheduled.stdout
    nacked = tickwheel("consume", "--topic", name, "--count", "4", "--nack")
    assert nacked.returncode == 0, nacked.stdout + nacked.stderr
    assert [f"attempt={n}" in nacked.stdout for n in (1, 2, 3, 4)] == [True] * 4
    dead = tickwheel("consume", "--topic", f"%DLQ%{name}", "--count", "1")
    assert dead.returncode == 0, dead.stdout + dead.stderr
    assert "attempt=5" in dead.stdout and "body=b'cli'" in dead.stdout
