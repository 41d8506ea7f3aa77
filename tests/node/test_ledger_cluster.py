"""The ledger on real nodes: a leader's and a follower's both hold the committed lifecycle of
messages (scheduled, leased, acked, cancelled, rescheduled), row for row the same, and the
leader's holds its sends; a node started with ``--no-ledger`` keeps none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nodetests import now_ms

from tickwheel.client import Message
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for

pytestmark = pytest.mark.cluster

COMMITTED = ("scheduled", "leased", "acked", "cancelled", "rescheduled")


def committed(node: LocalNode, ids: set[str]) -> dict[str, Any] | None:
    """The node's committed rows of ``ids``' messages, once every due one is acked."""
    rows = node.ledger()
    handles = {row["handle"]: row["id"] for row in rows
               if row["event"] == "scheduled" and row["id"] in ids}
    mine = [row for row in rows if row["event"] in COMMITTED and row["handle"] in handles]
    acked = {handles[row["handle"]] for row in mine if row["event"] == "acked"}
    if not {i for i in ids if i.startswith("due")} <= acked:
        return None
    return {"rows": mine, "handles": handles}


def test_a_leader_and_a_follower_hold_the_lifecycle_and_the_leader_its_sends(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        leader = cluster.leader(timeout_s=30)
        follower = next(node for node in cluster.nodes if node is not leader)
        with cluster.client(timeout_s=30) as client:
            due = [Message("ledgered", b"x", delay_ms=0, id=f"due-{i}") for i in range(20)]
            later = [Message("ledgered", b"y", delay_ms=600_000, id=f"later-{i}")
                     for i in range(2)]
            client.schedule_many(due)
            handles = [scheduled.handle for scheduled in client.schedule_many(later)]
            assert client.cancel(handles[0]) is True
            client.reschedule([handles[1]], delay_ms=900_000)
            with client.consume("ledgered", prefetch=64) as consumer:
                for count, message in enumerate(consumer, 1):
                    message.ack()
                    if count == len(due):
                        break
        ids = {m.id for m in due + later}
        seen = {node.raft: wait_for(lambda node=node: committed(node, ids), 20,
                                    f"{node.raft}'s ledger to hold every ack")
                for node in (leader, follower)}
        sent = [row for row in leader.ledger("sent") if row["id"] in ids]
        started = leader.ledger("dispatch_started")
    for found in seen.values():
        by_event = {event: [row for row in found["rows"] if row["event"] == event]
                    for event in COMMITTED}
        id_of = found["handles"]
        assert {row["id"] for row in by_event["scheduled"]} == ids
        assert all(row["attempt"] == 1 and row["deliver_at_ms"] for row
                   in by_event["scheduled"])
        leased = [row for row in by_event["leased"] if id_of[row["handle"]].startswith("due")]
        assert sorted(id_of[row["handle"]] for row in leased) == sorted(m.id for m in due)
        assert all(row["lease"] == 1 and row["possible_duplicate"] is False
                   and row["group"] == "" and row["topic"] == "ledgered" for row in leased)
        assert [row["id"] for row in by_event["cancelled"]] == ["later-0"]
        (moved,) = by_event["rescheduled"]
        assert moved["id"] == "later-1" and moved["new_handle"] != moved["handle"]
        assert 250_000 < moved["deliver_at_ms"] - moved["old_deliver_at_ms"] < 350_000
    # every replica applied the same log: the same changes, in the same order
    rows_of = [[(row["event"], row["handle"], row["lease"], row["time_ms"])
                for row in found["rows"]] for found in seen.values()]
    assert rows_of[0] == rows_of[1]
    assert sorted(row["id"] for row in sent) == sorted(m.id for m in due)
    assert all(row["consumer"] and row["term"] and row["possible_duplicate"] is False
               and row["lease"] == 1 and row["time_ms"] <= now_ms() for row in sent)
    assert started and all(row["term"] for row in started)


def test_a_node_without_a_ledger_keeps_none(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 1, ("--no-ledger",)) as cluster, cluster.client(
            timeout_s=30) as client:
        client.schedule_many([Message("quiet", b"x", delay_ms=0, id="q-0")])
        with client.consume("quiet", prefetch=8) as consumer:
            next(iter(consumer)).ack()
    assert not (cluster.nodes[0].data / "ledger").exists()
