"""A rolling upgrade from release 0.0.4 and back, on a real 3-node cluster under load: until the
upgrade is finalized the cluster writes 0.0.4's formats, so any member can go back
(`tickwheel.common.versions`; docs/replication.md#compatibility).

One cluster goes through every order, the load running throughout: forward with the leader
last, back with the leader first, forward with the leader first (a finalize refused meanwhile,
naming the member still on 0.0.4), back with the followers first, one of them, on 0.0.4, kept
down while the upgraded leader compacts its log, so that it is sent the leader's snapshot. A
node of 0.0.4 opening a snapshot this build wrote (every rollback here: snapshots are taken
every 50 entries) or sent one stopped applying before the gate. At the end every message
acknowledged by Schedule was delivered, a message received twice was flagged, and messages
due in a day are still pending. A second test finalizes a cluster of this build and sees the
version switch on.
"""

from __future__ import annotations

import zipfile
from collections import Counter
from pathlib import Path

import grpc
import pytest
from test_upgrade import Producer, now_ms

from tickwheel.client import Client, Message, Received, TickwheelClientError
from tickwheel.common.versions import BASELINE, CURRENT
from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade"
RELEASE_WHEEL = FIXTURE / "tickwheel-0.0.4-c5effa3.whl"
SNAPSHOT_ARGS = ("--snapshot-min-entries", "50")
"""Snapshots every 50 entries: every node restarted here opens one, and a leader compacts past
a follower kept down for a few seconds."""
FAR_MSGS = 20
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Release 0.0.4, unpacked: a folder to put first on a node's ``PYTHONPATH``."""
    folder = tmp_path_factory.mktemp("release-0.0.4")
    with zipfile.ZipFile(RELEASE_WHEEL) as wheel:
        wheel.extractall(folder)
    return folder


def info(node: LocalNode) -> pb.ClusterInfoResponse:
    answer = node.info(5)
    assert answer is not None, f"{node.raft} does not answer"
    return answer


def runs_release(node: LocalNode) -> bool:
    """A node of 0.0.4 reports no cluster version (the field came after it)."""
    return info(node).cluster_version == 0


class Rolling:
    """Restarts of one cluster's nodes on a build, each waited for: up, caught up with the
    leader, and the load going on."""

    def __init__(self, cluster: LocalCluster, producer: Producer) -> None:
        self.cluster = cluster
        self.producer = producer

    def restart(self, node: LocalNode, build: Path | None) -> LocalNode:
        self.cluster.stop(node)
        node.build = build
        self.cluster.start(node)
        return self.settle(node)

    def settle(self, node: LocalNode) -> LocalNode:
        """Wait for ``node`` to follow a leader within 100 entries and for 100 more messages
        to be scheduled; the leader."""
        leader = self.cluster.leader(30)
        wait_for(lambda: (seen := node.info()) is not None
                 and seen.last_applied >= info(leader).commit_index - 100, 30,
                 f"{node.raft} to catch up")
        settled = len(self.producer.acknowledged)
        wait_for(lambda: len(self.producer.acknowledged) >= settled + 100, 30,
                 "scheduling to go on")
        assert (node.build is not None) == runs_release(node), node.raft
        return self.cluster.leader(30)

    def followers(self) -> list[LocalNode]:
        leader = self.cluster.leader(30)
        return [node for node in self.cluster.nodes if node is not leader]


def finalize_refusal(cluster: LocalCluster) -> str:
    """A finalize asked of a node of this build (one of 0.0.4 has no such method)."""
    upgraded = next(node for node in cluster.nodes if node.build is None)
    with Client([upgraded.grpc_address], credentials=cluster.credentials("admin"),
                timeout_s=10) as client, pytest.raises(TickwheelClientError) as refused:
        client.finalize_upgrade()
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION, refused.value
    return str(refused.value)


def snapshot_installs(node: LocalNode) -> int:
    return node.log_path.read_bytes().count(b"event=snapshot_installed")


def test_a_cluster_of_0_0_4_goes_forward_and_back_in_every_order(
        tmp_path: Path, release: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", extra_args=SNAPSHOT_ARGS,
                           ledger_segment_age_ms=None)  # 0.0.4 has no ledger
    for node in cluster.nodes:
        node.build = release
    receipts: list[Received] = []
    with cluster, cluster.client(timeout_s=30) as client:
        cluster.leader(30)
        far = [Message("far", b"x", deliver_at_ms=now_ms() + DAY_MS, id=f"far-{i}")
               for i in range(FAR_MSGS)]
        client.schedule_many(far)
        with AckingConsumer(cluster, "upgrade", on_message=receipts.append):
            producer = Producer(cluster, "upgrade")
            rolling = Rolling(cluster, producer)
            wait_for(lambda: len(producer.acknowledged) >= 200, 30, "load on 0.0.4")
            # forward, the leader last; then back, the leader first
            for node in [*rolling.followers(), cluster.leader(30)]:
                rolling.restart(node, None)
            leader = cluster.leader(30)
            assert info(leader).cluster_version == BASELINE
            assert {m.version for m in info(leader).members} == {CURRENT}
            for node in [leader, *rolling.followers()]:
                rolling.restart(node, release)
            # forward, the leader first; a finalize is refused while a member runs 0.0.4
            old = rolling.followers()
            for node in [cluster.leader(30), old[0]]:
                rolling.restart(node, None)
            assert old[1].raft in finalize_refusal(cluster)
            # back, the followers first: one of them sent the upgraded leader's snapshot
            kept_down = rolling.followers()[0]
            cluster.stop(kept_down)
            kept_down.build = release
            installs = snapshot_installs(kept_down)
            behind = info(cluster.leader(30)).commit_index + 300
            wait_for(lambda: info(cluster.leader(30)).commit_index >= behind, 60,
                     "300 entries while a follower is down")
            cluster.start(kept_down)
            rolling.settle(kept_down)
            assert snapshot_installs(kept_down) > installs, "it was sent a snapshot"
            for node in [*[n for n in rolling.followers() if n.build is None],
                         cluster.leader(30)]:
                rolling.restart(node, release)
            assert all(runs_release(node) for node in cluster.nodes)
            scheduled = producer.stop()
            wait_for(lambda: {m.id for m in receipts} >= scheduled, 60,
                     "every scheduled message delivered")
        pending = {p.topic: p.pending for p in client.cluster_info().pending}
        assert pending.get("far") == FAR_MSGS
    assert len(scheduled) >= 2_000
    counts = Counter(message.id for message in receipts)
    seen: set[str] = set()
    for message in receipts:  # a message received again is flagged as a possible duplicate
        assert message.id not in seen or message.possible_duplicate, (message.id,
                                                                      counts[message.id])
        seen.add(message.id)


def test_a_finalized_cluster_writes_the_new_version(tmp_path: Path, release: Path) -> None:
    """A cluster of 0.0.4 upgraded, finalized: the version is replicated, answered again by a
    second finalize, and survives a restart of every node (its snapshots carry it)."""
    cluster = LocalCluster(tmp_path / "cluster", extra_args=SNAPSHOT_ARGS,
                           ledger_segment_age_ms=None)  # 0.0.4 has no ledger
    for node in cluster.nodes:
        node.build = release
    with cluster, cluster.client(timeout_s=30) as client:
        cluster.leader(30)
        for node in cluster.nodes:
            cluster.stop(node)
            node.build = None
            cluster.start(node)
            cluster.leader(30)
        assert info(cluster.leader(30)).cluster_version == BASELINE
        wait_for(lambda: {m.version for m in info(cluster.leader(30)).members} == {CURRENT},
                 10, "every member's answer heard")
        assert client.finalize_upgrade() == CURRENT
        assert client.finalize_upgrade() == CURRENT
        client.schedule_many([Message("t", b"x", deliver_at_ms=now_ms() + 60_000,
                                      id=f"m{i}") for i in range(200)])
        for node in cluster.nodes:
            wait_for(lambda node=node: info(node).cluster_version == CURRENT, 10,
                     f"{node.raft} to apply the finalize")
        for node in cluster.nodes:  # all down before any starts: each reads its own files
            cluster.stop(node)
        for node in cluster.nodes:
            cluster.start(node)
        cluster.leader(30)
        for node in cluster.nodes:
            wait_for(lambda node=node: (seen := node.info()) is not None
                     and seen.cluster_version == CURRENT, 30, f"{node.raft} back at 2")
