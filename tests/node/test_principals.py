"""Who asked, on real nodes: a message scheduled with one principal's token and cancelled (or
rescheduled) with another's shows each principal in every replica's ledger rows and in
``tickwheel trace``; a cluster held at version 1 beside a node of release 0.0.4 writes the
entries that node applies, and its ledgers name nobody. Without processes:
tests/replication/test_principals.py."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from nodetests import now_ms
from test_cli import tickwheel

from tickwheel.client import Client, Message
from tickwheel.client.ledger import LedgerClient, Node, TracedEvent
from tickwheel.common.versions import BASELINE
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for

pytestmark = pytest.mark.cluster

RELEASE_WHEEL = (Path(__file__).parent.parent / "fixtures" / "upgrade"
                 / "tickwheel-0.0.4-c5effa3.whl")
PRINCIPALS = {"scheduler": [{"actions": ["schedule"], "topics": ["owned"]}],
              "canceller": [{"actions": ["cancel"], "topics": ["owned"]}]}
ASKED = ("scheduled", "cancelled", "rescheduled")


def asked_rows(node: LocalNode, ids: set[str], events: int) -> list[tuple[str, str, Any]] | None:
    """``(event, id, principal)`` of the node's closed ledger rows about ``ids``, once it
    holds ``events`` of them."""
    rows = sorted((row["event"], row["id"], row["principal"]) for row in node.ledger()
                  if row["event"] in ASKED and row["id"] in ids)
    return rows if len(rows) >= events else None


def scheduled_then_changed(cluster: LocalCluster, clients: list[Client]) -> None:
    """``kept`` scheduled by ``scheduler``; ``cancelled`` cancelled and ``moved`` rescheduled
    by ``canceller``, through any node (a follower forwards to the leader)."""
    scheduler, canceller = clients
    due_ms = now_ms() + 3_600_000
    handles = [scheduled.handle for scheduled in scheduler.schedule_many(
        [Message("owned", b"x", deliver_at_ms=due_ms, id=name)
         for name in ("kept", "cancelled", "moved")])]
    assert canceller.cancel(handles[1]) is True
    canceller.reschedule([handles[2]], deliver_at_ms=due_ms + 60_000)


def test_each_principal_is_in_every_replicas_ledger_and_in_trace(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, principals=PRINCIPALS) as cluster:
        cluster.leader(timeout_s=30)
        targets = [node.grpc_address for node in cluster.nodes]
        with Client(targets, credentials=cluster.credentials("scheduler"), timeout_s=30) as a, \
                Client(targets, credentials=cluster.credentials("canceller"),
                       timeout_s=30) as b:
            scheduled_then_changed(cluster, [a, b])
        ids = {"kept", "cancelled", "moved"}
        expected = [("cancelled", "cancelled", "canceller"),
                    ("rescheduled", "moved", "canceller"),
                    ("scheduled", "cancelled", "scheduler"), ("scheduled", "kept", "scheduler"),
                    ("scheduled", "moved", "scheduler")]
        for node in cluster.nodes:
            assert wait_for(lambda node=node: asked_rows(node, ids, 5), 20,
                            f"{node.raft}'s ledger to hold the rows") == expected
        assert cluster.security is not None
        env = cluster.security.environment()
        target = ",".join(targets)
        answer = tickwheel("trace", "--target", target, "moved", "--json", env=env)
        assert answer.returncode == 0, answer.stdout + answer.stderr
        events = json.loads(answer.stdout)["events"]
        assert [(e["event"], e["principal"], len(e["nodes"])) for e in events] == [
            ("scheduled", "scheduler", 3), ("rescheduled", "canceller", 3)]
        table = tickwheel("trace", "--target", target, "cancelled", env=env)
        assert table.returncode == 0, table.stdout + table.stderr
        assert "scheduler" in table.stdout and "canceller" in table.stdout


def test_a_cluster_held_at_version_1_writes_what_0_0_4_applies_and_names_nobody(
        tmp_path: Path) -> None:
    release = tmp_path / "release-0.0.4"
    with zipfile.ZipFile(RELEASE_WHEEL) as wheel:
        wheel.extractall(release)
    cluster = LocalCluster(tmp_path / "cluster", principals=PRINCIPALS,
                           ledger_segment_age_ms=None)  # 0.0.4 has no ledger
    for node in cluster.nodes:
        node.build = release
    with cluster:
        cluster.leader(timeout_s=30)
        old = cluster.nodes[0]
        for node in cluster.nodes[1:]:  # this build, the cluster still at version 1
            cluster.stop(node)
            node.build = None
            cluster.start(node)
            cluster.leader(timeout_s=30)
        cluster.stop(old)  # so that a node of this build leads, and writes the entries
        leader = cluster.leader(timeout_s=30)
        info = leader.info(5)
        assert leader.build is None and info is not None and info.cluster_version == BASELINE
        cluster.start(old)
        new = [node.grpc_address for node in cluster.nodes[1:]]
        with Client(new, credentials=cluster.credentials("scheduler"), timeout_s=30) as a, \
                Client(new, credentials=cluster.credentials("canceller"), timeout_s=30) as b:
            scheduled_then_changed(cluster, [a, b])
        commit_index = leader.info(5).commit_index  # type: ignore[union-attr]
        wait_for(lambda: (seen := old.info(2)) is not None
                 and seen.last_applied >= commit_index, 30,
                 "the node of 0.0.4 to apply every entry")
        assert old.alive() and old.info(5) is not None
        with LedgerClient(new, credentials=cluster.credentials()) as ledger:
            for node in cluster.nodes[1:]:
                found = ledger.trace("moved", close_open=True, nodes=[Node(0, node.grpc_address)])
                assert [asked(e) for e in found.events] == [
                    ("scheduled", ""), ("rescheduled", "")], node.raft


def asked(event: TracedEvent) -> tuple[str, str | None]:
    return event.event, event.principal
