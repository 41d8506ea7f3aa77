"""Time you can trust (issue 40), with real nodes: the leader's clock steps 5 s ahead, then 5 s
behind, while it runs and messages come due; by the test's clock (the machine's, the true
time here) nothing arrives before its due time and nothing more than a second after it.

The nodes run with ``--fault-injection`` and obey a clock step written to their data folder
(`LocalNode.step_clock`), as the chaos runner's ``clock-step`` fault does."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tickwheel.client import Message, Received
from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster, wait_for

pytestmark = pytest.mark.cluster

STEP_MS = 5_000
MAX_LATE_MS = 1_000
DELAY_MS = 1_500


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Receipts:
    """What the consumer received, each with the test's clock at its arrival."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: dict[str, tuple[int, Received]] = {}

    def __call__(self, message: Received) -> None:
        received_ms = now_ms()
        with self.lock:
            self.first.setdefault(message.id, (received_ms, message))

    def ids(self) -> set[str]:
        with self.lock:
            return set(self.first)


def schedule_phase(cluster: LocalCluster, name: str) -> dict[str, tuple[int, int]]:
    """Messages due 1-3 s from now by absolute time, and some by ``delay_ms`` (their due
    time the leader's); returns id -> (sent_ms, acked_ms) of the ``delay_ms`` ones."""
    first_due_ms = now_ms() + 1_000
    with cluster.client() as client:
        client.schedule_many([Message("orders", b"x", deliver_at_ms=first_due_ms + 10 * i,
                                      id=f"{name}-at-{i}") for i in range(200)])
        delayed = {}
        for i in range(20):
            sent_ms = now_ms()
            client.schedule("orders", b"x", delay_ms=DELAY_MS + 50 * i, id=f"{name}-in-{i}")
            delayed[f"{name}-in-{i}"] = (sent_ms + DELAY_MS + 50 * i,
                                         now_ms() + DELAY_MS + 50 * i)
    return delayed


def test_a_leader_whose_clock_steps_5_s_either_way_delivers_on_time_by_the_true_clock(
        tmp_path: Path) -> None:
    receipts = Receipts()
    delayed: dict[str, tuple[int, int]] = {}
    with LocalCluster(tmp_path, extra_args=("--fault-injection",)) as cluster:
        leader = cluster.leader()
        with AckingConsumer(cluster, on_message=receipts):
            for offset_ms in (STEP_MS, -STEP_MS):
                leader.step_clock(offset_ms, 10)
                phase = schedule_phase(cluster, f"at{offset_ms:+d}")
                delayed |= phase
                wanted = {f"at{offset_ms:+d}-at-{i}" for i in range(200)} | phase.keys()
                wait_for(lambda wanted=wanted: wanted <= receipts.ids(), 30,
                         f"every message of the {offset_ms:+d} ms phase")
            assert cluster.leader() is leader  # the stepped clock led throughout
    early, late = [], []
    for message_id, (received_ms, message) in receipts.first.items():
        if received_ms < message.deliver_at_ms:
            early.append((message_id, message.deliver_at_ms - received_ms))
        if received_ms > message.deliver_at_ms + MAX_LATE_MS:
            late.append((message_id, received_ms - message.deliver_at_ms))
    assert early == [], f"early by (ms): {early[:10]} ({len(early)} in all)"
    assert late == [], f"late by (ms): {late[:10]} ({len(late)} in all)"
    # a due time computed from delay_ms is the cluster's time plus the delay (within a round
    # trip), not the leader's own clock's
    off = [(message_id, receipts.first[message_id][1].deliver_at_ms, lowest, highest)
           for message_id, (lowest, highest) in delayed.items()
           if not lowest - 100 <= receipts.first[message_id][1].deliver_at_ms <= highest]
    assert off == []
