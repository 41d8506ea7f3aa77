"""A leader SIGKILLed while its sends are in rows it has not closed into a segment (its open
segment, its buffer): the production audit calls none of those deliveries overdue. The
restarted node records a ``torn_segment`` gap over them; the audit reports the gap, the
deliveries whose sends were lost as *unknown*, and stays clean.

The run: three nodes whose segments close only at 10 minutes (so every send of the leader
is unclosed when it dies); ``orders`` received by ``Client.receive`` and never acked, each
under a lease that outlives the run (so no ack and no second send tells the audit anything:
the killed leader's ``sent`` rows were the only evidence); the leader SIGKILLed, started
again, then every node stopped (SIGTERM)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ledgers import all_rows, fetch_layout
from sparktests import spark_session

from tickwheel.audit import AuditOptions, audit_ledgers
from tickwheel.harness.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
GRACE_MS = 2_000
MESSAGES = 12
LEASE_MS = 600_000


def test_sends_a_killed_leader_had_not_closed_are_unknown_never_overdue(
        tmp_path: Path, in_background: Callable[..., Any]) -> None:
    with LocalCluster(tmp_path / "cluster", ledger_segment_age_ms=LEASE_MS) as cluster, \
            cluster.client(timeout_s=30) as client:
        leader = cluster.leader(timeout_s=30)
        due_ms = int(time.time() * 1000) + 1_000
        for n in range(MESSAGES):
            client.schedule("orders", b"x", deliver_at_ms=due_ms + 10 * n, id=f"m-{n}")
        received: set[str] = set()
        while len(received) < MESSAGES:
            received |= {message.id for message in client.receive(
                "orders", consumer="holder", max_messages=MESSAGES,
                invisible_duration_ms=LEASE_MS, wait_ms=5_000)}
        cluster.signal(leader, signal.SIGKILL)
        cluster.start(leader)
        cluster.leader(timeout_s=30)
    folder = fetch_layout(cluster, tmp_path / "fetched")
    rows = [row for _, row in all_rows(folder)]
    assert not [row for row in rows if row["event"] == "sent"]  # died with the leader
    assert sum(row["event"] == "leased" for row in rows) >= MESSAGES  # committed: kept

    options = AuditOptions(grace_ms=GRACE_MS, until_ms=due_ms + 10 * MESSAGES + GRACE_MS)
    sessions = spark_session(in_background)
    spark = next(sessions)
    try:
        summary = in_background(audit_ledgers, spark, folder, options)
    finally:
        next(sessions, None)
    shard = summary["shards"]["0"]
    assert shard["overdue"] == {"count": 0, "never_sent": 0, "ids": []}
    assert shard["unknown"] == {"count": MESSAGES, "ids": sorted(received)}
    killed = [gap for gap in shard["gaps"] if gap["node"] == leader.data.name]
    assert [gap["reason"] for gap in killed] == ["torn_segment"]
    assert killed[0]["from_ms"] <= due_ms <= killed[0]["to_ms"]
    assert summary["verdict"] == "clean"
