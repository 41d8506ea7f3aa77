"""Upgrades in place: this build opens a data folder release 0.0.4 wrote and delivers
everything in it, and a 3-node cluster of 0.0.4 is upgraded one node at a time under load
without losing a message (and back again: test_rollback.py).

Release 0.0.4 is ``tests/fixtures/upgrade/tickwheel-0.0.4-c5effa3.whl`` (made by
``make_wheel.py`` there, unpacked and put first on a node's ``PYTHONPATH``); its data folder,
and what each message in it must come to, were written by ``make_data.py``. deploy/README.md
has the rule they keep.
"""

from __future__ import annotations

import json
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from tickwheel.client import CancelOutcome, Client, Message
from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import (
    LocalCluster,
    LocalNode,
    wait_for,
)

pytestmark = pytest.mark.cluster

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade"
PREVIOUS_WHEEL = FIXTURE / "tickwheel-0.0.4-c5effa3.whl"
DAY_MS = 86_400_000
SKEW_MS = 45 * DAY_MS
"""The upgraded node's clock runs this far ahead: it opens data 45 days old at least, so its
cursor walks weeks of seconds and some of the far messages come due."""


@pytest.fixture(scope="module")
def previous_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous build, unpacked: a folder to put first on ``PYTHONPATH``."""
    folder = tmp_path_factory.mktemp("previous-build")
    with zipfile.ZipFile(PREVIOUS_WHEEL) as wheel:
        wheel.extractall(folder)
    return folder


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def drain(client: Client, topic: str, group: str, received: set[str]) -> None:
    for message in client.receive(topic, consumer="upgrade-test", group=group, wait_ms=500):
        message.ack()
        received.add(message.id)


def test_a_data_folder_of_the_previous_build_opens_and_delivers_everything(
        tmp_path: Path) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    topic, groups, messages = expected["topic"], expected["groups"], expected["messages"]
    root = tmp_path / "cluster"
    root.mkdir()
    with tarfile.open(FIXTURE / "data.tar.gz") as archive:
        archive.extractall(root, filter="data")
    cluster = LocalCluster(root, size=1, base_port=expected["base_port"])
    cluster.nodes[0].clock_skew_ms = SKEW_MS
    with cluster, cluster.client(timeout_s=30) as client:
        cluster.leader(30)
        now = now_ms() + SKEW_MS
        due = {name for name, m in messages.items() if m["fate"] == "deliver"
               and m["due_ms"] <= now}
        ahead = sorted((m["due_ms"], name) for name, m in messages.items()
                       if m["fate"] == "deliver" and m["due_ms"] > now)
        assert len(due) >= 47, "the fixture's 45 near messages and two far ones"
        for group in groups:
            received: set[str] = set()
            wait_for(lambda group=group, received=received: drain(
                client, topic, group, received) or received >= due, 60,
                f"group {group!r} to receive every message due")
            drain(client, topic, group, received)  # and nothing else comes
            assert received == due, (group, sorted(received - due), sorted(due - received))

        def pending() -> int:
            return sum(p.pending for p in client.cluster_info().pending if p.topic == topic)
        wait_for(lambda: pending() == len(ahead), 10, f"{len(ahead)} messages pending")
        if ahead:  # until the fixture's last message is due in real time (+300 days)
            last = messages[ahead[-1][1]]
            assert client.cancel_outcomes([last["handle"]]) == [CancelOutcome.CANCELLED]
        if len(ahead) >= 2:
            first = ahead[0][1]
            client.reschedule([messages[first]["handle"]], delay_ms=0)
            for group in groups:
                received = set()
                wait_for(lambda group=group, received=received: drain(
                    client, topic, group, received) or first in received, 30,
                    f"the rescheduled message in group {group!r}")


def runs_this_build(node: LocalNode) -> bool:
    """This build's nodes report the cluster version; those of 0.0.4 do not (0)."""
    info = node.info(5)
    assert info is not None, f"{node.raft} does not answer"
    return info.cluster_version != 0


class Producer:
    """Schedules batches due 0.5 to 2 s ahead until stopped; ``acknowledged`` holds the ids
    whose Schedule answered (the client retries across leader changes and restarts)."""

    def __init__(self, cluster: LocalCluster, topic: str) -> None:
        self.acknowledged: set[str] = set()
        self._client = cluster.client(timeout_s=60)
        self._topic = topic
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        batch = 0
        try:
            while not self._stop.wait(0.05):
                due_ms = now_ms() + 500 + batch % 4 * 500
                ids = [f"b{batch}-{i}" for i in range(20)]
                self._client.schedule_many([Message(self._topic, b"x", deliver_at_ms=due_ms,
                                                    id=name) for name in ids])
                self.acknowledged.update(ids)
                batch += 1
        except BaseException as error:  # reported by stop
            self.error = error

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(90)
        self._client.close()
        assert self.error is None, self.error
        return self.acknowledged


def test_a_cluster_of_the_previous_build_upgraded_one_node_at_a_time_loses_nothing(
        tmp_path: Path, previous_build: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", ledger_segment_age_ms=None)  # 0.0.4 has none
    for node in cluster.nodes:
        node.build = previous_build
    received: set[str] = set()
    with cluster:
        cluster.leader()
        assert not any(runs_this_build(node) for node in cluster.nodes)
        with AckingConsumer(cluster, "upgrade", on_message=lambda m: received.add(m.id)):
            producer = Producer(cluster, "upgrade")
            wait_for(lambda: len(producer.acknowledged) >= 400, 30, "load before the upgrade")
            for node in reversed(cluster.nodes):  # a StatefulSet's order: the last pod first
                cluster.stop(node)
                node.build = None
                cluster.start(node)
                leader = cluster.leader(30)
                wait_for(lambda node=node, leader=leader: (info := node.info()) is not None
                         and info.last_applied >= leader.info().commit_index - 100, 30,
                         f"{node.raft} to catch up")
                settled = len(producer.acknowledged)
                wait_for(lambda settled=settled: len(producer.acknowledged) >= settled + 200,
                         30, "scheduling to go on")
            scheduled = producer.stop()
            wait_for(lambda: received >= scheduled, 60, "every scheduled message delivered")
        assert all(runs_this_build(node) for node in cluster.nodes)
    assert len(scheduled) >= 1_000, "400 before the upgrade and 200 after each node's restart"
