"""A power cut of every node at once (issue 18), on real nodes run with ``--fsync``.

The nodes note what each of their syncs made durable (`SyncLedger`). Producers write; every
node is killed at once (SIGKILL: the kernel still holds what they wrote); then each node's
files lose every byte not synced (`power_cut`), as the disks would after a power cut, and the
nodes start again. Every message a producer was told was scheduled is delivered, once.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from tickwheel.chaos.storage import power_cut
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.replication.raft import SyncLedger
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

BATCH = 10
AHEAD_MS = 600_000
"""How far ahead the messages are due: none may come due before the power cut, however slowly
a loaded machine schedules them. The nodes start again with their clocks this far ahead, so
that everything is due at once (no waiting for the time to come)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Producer(threading.Thread):
    """Schedules batches on the leader until stopped; ``acked`` holds the ids of every batch
    the cluster answered."""

    def __init__(self, cluster: LocalCluster, due_ms: int) -> None:
        super().__init__(name="producer", daemon=True)
        self._cluster = cluster
        self._due_ms = due_ms
        self.acked: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        batch = 0
        while not self.stop.is_set():
            ids = [f"m-{batch}-{i}" for i in range(BATCH)]
            messages = [pb.Message(id=i, topic="orders", body=b"x" * 200,
                                   deliver_at_ms=self._due_ms + batch % 1_000) for i in ids]
            try:
                self._cluster.leader(1).stub.Schedule(pb.ScheduleRequest(messages=messages),
                                                      timeout=2)
            except (grpc.RpcError, TimeoutError, RuntimeError):
                continue  # killed under it: this batch is unknown, the next is another
            self.acked.update(ids)
            batch += 1


def test_every_acknowledged_message_survives_a_power_cut_of_every_node(
        tmp_path: Path, acking_consumer) -> None:
    """Without a sync before acknowledging (the journal's msync, the files a snapshot names),
    the cut drops entries the producer was told were scheduled, and they are never delivered."""
    with LocalCluster(tmp_path, extra_args=("--snapshot-min-entries", "20"),
                      power_cuts=True) as cluster:
        cluster.leader()
        producer = Producer(cluster, due_ms=now_ms() + AHEAD_MS)
        producer.start()
        wait_for(lambda: all((node.data / "raft" / "snapshot").exists()
                             for node in cluster.nodes) and len(producer.acked) >= 3_000,
                 30, "3,000 messages scheduled and a snapshot on every node")
        for node in cluster.nodes:  # the power goes out while the producer writes
            cluster.signal(node, signal.SIGKILL)
        producer.stop.set()
        producer.join(10)
        cuts = [power_cut(node.data, SyncLedger(node.sync_ledger)) for node in cluster.nodes]
        # the state written since the last snapshot was not synced: the journal must bring it
        assert all(cut.files > 0 and cut.bytes > 0 for cut in cuts), cuts
        for node in cluster.nodes:  # due by their clocks: the last batch's spread included
            cluster.start(node, clock_skew_ms=AHEAD_MS + 1_000)
        acking_consumer(cluster)

        missing: set[str] = set()

        def delivered() -> Counter[str] | None:
            counts = Counter(d["id"] for d in cluster.deliveries())
            missing.clear()
            missing.update(producer.acked - counts.keys())
            return None if missing else counts
        try:
            counts = wait_for(delivered, 60, f"{len(producer.acked)} acknowledged messages "
                                             "delivered", poll_s=0.5)
        except TimeoutError as timeout:  # name what is missing: a loss, or a stall?
            raise AssertionError(f"{len(missing)} of {len(producer.acked)} acknowledged "
                                 f"messages not delivered, e.g. {sorted(missing)[:10]}; "
                                 f"cuts {cuts}") from timeout
        assert max(counts.values()) == 1
