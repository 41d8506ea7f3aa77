"""Growing a running cluster from two shards to four (docs/shards.md#growing-a-running-cluster),
on real node processes, while a producer schedules and a consumer started before the growth
receives: nothing lost, nothing delivered twice unflagged, and an id scheduled before the growth
still answered as a duplicate, with its first handle, by whichever shard the new map sends it
to. Then what a hostile or careless operator may try: a map change out of order, within the
dedupe window, or by a principal that is no admin."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tickwheel.client import AsyncClient, Message, Received
from tickwheel.client.credentials import open_channel
from tickwheel.client.shards import handle_shard, receipt_shard, shard_of
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.replication.raft import read_snapshot
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cluster

PRINCIPALS = {"tenant": [{"actions": ["schedule", "cancel", "consume"], "topics": ["*"]}]}
DUE_IN_MS = 1_500
"""How far ahead the producer's messages are due: some are still pending at the growth."""


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, dict]]:
    """Two shards of one replica each, grown to four under load; what happened, for the
    tests to look at."""
    with LocalCluster(tmp_path_factory.mktemp("growth"), 1, shards=2, principals=PRINCIPALS,
                      extra_args=("--snapshot-min-entries", "20"), metrics=True) as cluster:
        cluster.leaders(timeout_s=60)
        yield cluster, _grow_under_load(cluster)


class _Load:
    """A producer and two consumers (one blocking, one asyncio, each of its own group) of one
    topic, on threads, while the cluster grows; what each saw."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.topic = f"grow-{uuid.uuid4().hex[:8]}"
        self.scheduled: dict[str, int] = {}
        """id -> the handle its first scheduling answered"""
        self.before: list[str] = []
        """ids scheduled before the growth began"""
        self.after: list[str] = []
        """ids scheduled once it was done"""
        self.delivered: dict[str, list[Received]] = {"audit": [], "audit-async": []}
        self.stop, self.growing, self.grown = (threading.Event(), threading.Event(),
                                               threading.Event())
        self.failures: list[BaseException] = []
        self.threads = [self._guarded(self._produce), self._guarded(self._consume),
                        self._guarded(lambda: asyncio.run(self._consume_async()))]

    def _guarded(self, work: Callable[[], None]) -> threading.Thread:
        """A thread of ``work`` whose failure is noted for the test, and stops the others."""
        def run() -> None:
            try:
                work()
            except BaseException as error:  # the test reports it
                self.failures.append(error)
                self.stop.set()
        return threading.Thread(target=run, daemon=True)

    def all_delivered(self) -> bool:
        return bool(self.failures) or all(len({m.id for m in got}) >= len(self.scheduled)
                                          for got in self.delivered.values())

    def _produce(self) -> None:
        with self.cluster.client(timeout_s=60) as producer:
            for batch in range(10_000):
                if self.stop.is_set():
                    return
                due_ms = int(time.time() * 1000) + DUE_IN_MS
                done = self.grown.is_set()
                messages = [Message(self.topic, f"b{batch}", deliver_at_ms=due_ms,
                                    id=f"{self.topic}-{batch}-{n}") for n in range(20)]
                for result in producer.schedule_many(messages):
                    self.scheduled.setdefault(result.id, result.handle)
                if not self.growing.is_set():
                    self.before.extend(m.id for m in messages)
                if done:
                    self.after.extend(m.id for m in messages)
                time.sleep(0.02)

    def _consume(self) -> None:
        got = self.delivered["audit"]
        with self.cluster.client(timeout_s=60) as client, client.consume(
                self.topic, group="audit", prefetch=64) as consumer:
            for message in consumer:
                got.append(message)
                message.ack()
                if self.stop.is_set() and self.all_delivered():
                    return

    async def _consume_async(self) -> None:
        got = self.delivered["audit-async"]
        async with AsyncClient([node.grpc_address for node in self.cluster.nodes],
                               credentials=self.cluster.credentials(), timeout_s=60
                               ) as client, client.consume(self.topic, group="audit-async",
                                                           prefetch=64) as consumer:
            async for message in consumer:
                got.append(message)
                message.ack()
                if self.stop.is_set() and self.all_delivered():
                    return


def _grow_under_load(cluster: LocalCluster) -> dict:
    load = _Load(cluster)
    with cluster.client(timeout_s=60) as client:
        for group in load.delivered:
            client.create_group(load.topic, group)
    for thread in load.threads:
        thread.start()
    wait_for(lambda: len(load.before) >= 400 or None, 60, "400 messages before the growth")
    load.growing.set()
    version = cluster.grow(2)
    load.grown.set()
    wait_for(lambda: len(load.after) >= 400 or None, 60, "400 messages after the growth")
    load.stop.set()
    load.threads[0].join(60)
    wait_for(lambda: load.all_delivered() or None, 90,
             "every message scheduled to be delivered to both groups")
    for thread in load.threads[1:]:
        thread.join(10)
    assert not load.failures, load.failures
    # the ids scheduled before the growth, sent again by a client that reads the new map
    with cluster.client(timeout_s=60) as late:
        again = late.schedule_many([Message(load.topic, "again", delay_ms=DUE_IN_MS,
                                            id=message_id) for message_id in load.before])
        info = late.cluster_info()
    return {"version": version, "scheduled": load.scheduled, "before": load.before,
            "after": load.after, "delivered": load.delivered, "again": again, "info": info}


def test_the_map_grows_to_four_shards_and_new_ids_spread_over_them(grown: tuple) -> None:
    cluster, run = grown
    assert run["version"] == 2
    assert run["info"].map_version == 2
    assert [list(s.grpc_addresses) for s in run["info"].shards] == [
        [node.grpc_address for node in nodes] for nodes in cluster.shards]
    after = run["after"]
    placed = {handle_shard(run["scheduled"][i]) for i in after}
    assert placed == {0, 1, 2, 3}, placed  # the new shards take their part of new ids
    assert all(handle_shard(run["scheduled"][i]) == shard_of(i, 4) for i in after)
    assert {handle_shard(run["scheduled"][i]) for i in run["before"]} == {0, 1}

    def version_shown(node: LocalNode) -> bool | None:
        with urllib.request.urlopen(f"http://{node.metrics_address}/metrics",
                                    timeout=10) as page:
            return "tickwheel_shard_map_version 2.0" in page.read().decode() or None
    for node in cluster.nodes:  # every node, of the old shards and of the new
        wait_for(lambda node=node: version_shown(node), 10, f"{node.raft} to show version 2")


@pytest.mark.parametrize("group", ["audit", "audit-async"])
def test_nothing_is_lost_nor_delivered_twice_unflagged(grown: tuple, group: str) -> None:
    """To each group, through a consumer (blocking, or asyncio) started before the growth."""
    _, run = grown
    unflagged: list[str] = []
    seen: set[str] = set()
    for message in run["delivered"][group]:
        if message.id in seen and not message.possible_duplicate:
            unflagged.append(message.id)
        seen.add(message.id)
    assert not unflagged, unflagged[:10]
    assert seen == set(run["scheduled"])
    # the consumer opened streams to the shards added while it ran
    assert {receipt_shard(m.receipt) for m in run["delivered"][group]} == {0, 1, 2, 3}


def test_an_id_scheduled_before_the_growth_is_still_answered_as_a_duplicate(grown: tuple
                                                                             ) -> None:
    _, run = grown
    moved = [i for i in run["before"] if shard_of(i, 4) >= 2]
    assert len(moved) > 100  # jump hash moved about half of them to the new shards
    for message_id, result in zip(run["before"], run["again"], strict=True):
        assert result.duplicate, message_id
        assert result.handle == run["scheduled"][message_id], message_id


def test_a_map_change_out_of_order_or_inside_the_window_is_refused(grown: tuple) -> None:
    cluster, _ = grown
    stub = cluster.leader(shard=0).stub
    extra = [pb.NewShard(grpc_addresses=["127.0.0.1:1"], peer_addresses=["127.0.0.1:2"])]
    with pytest.raises(grpc.RpcError) as skipped:
        stub.GrowShards(pb.GrowShardsRequest(version=4, shards=extra), timeout=10)
    assert skipped.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "version" in skipped.value.details()
    with pytest.raises(grpc.RpcError) as early:
        stub.GrowShards(pb.GrowShardsRequest(version=3, shards=extra), timeout=10)
    assert early.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "dedupe window" in early.value.details()
    # the growth repeated is answered as done, and changes nothing
    added = [pb.NewShard(grpc_addresses=[n.grpc_address for n in nodes],
                         peer_addresses=[n.peer_address for n in nodes])
             for nodes in cluster.shards[2:]]
    again = stub.GrowShards(pb.GrowShardsRequest(version=2, shards=added), timeout=10)
    assert (again.version, again.shards) == (2, 4)


def test_only_an_admin_changes_the_map(grown: tuple) -> None:
    cluster, _ = grown
    extra = [pb.NewShard(grpc_addresses=["127.0.0.1:1"], peer_addresses=["127.0.0.1:2"])]
    with open_channel(cluster.leader(shard=0).grpc_address,
                      cluster.credentials("tenant"), ()) as channel, pytest.raises(
                          grpc.RpcError) as refused:
        pb_grpc.TickwheelStub(channel).GrowShards(
            pb.GrowShardsRequest(version=3, shards=extra), timeout=10)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "admin" in refused.value.details()


def test_the_cli_finishes_a_growth_and_status_shows_the_version(grown: tuple) -> None:
    """``tickwheel grow-shards`` run again on a cluster it grew (an operator retrying after
    losing the answer): every shard answers the map in force, and nothing changes."""
    cluster, _ = grown
    assert cluster.security is not None
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TICKWHEEL_")},
           **cluster.security.environment(), "COLUMNS": "200"}
    target = cluster.shards[0][0].grpc_address
    members = [arg for k in (2, 3) for node in cluster.shards[k]
               for arg in ("--shard-member", f"{k}={node.grpc_address}={node.peer_address}")]
    grow = subprocess.run([sys.executable, "-m", "tickwheel.node", "grow-shards", "--target",
                           target, *members], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert grow.returncode == 0, grow.stdout + grow.stderr
    assert "shard map version 2: 4 shards" in grow.stdout
    gap = subprocess.run([sys.executable, "-m", "tickwheel.node", "grow-shards", "--target",
                          target, "--shard-member", "6=127.0.0.1:1=127.0.0.1:2"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert gap.returncode == 2 and "numbered from 4" in gap.stdout
    status = subprocess.run([sys.executable, "-m", "tickwheel.node", "status", "--target",
                             target], capture_output=True, text=True, env=env, timeout=60,
                            check=False)
    assert status.stdout.count("(map version 2)") == 4, status.stdout


def test_an_old_shard_restarted_as_before_the_growth_keeps_the_map_its_log_took(
        grown: tuple) -> None:
    """The map a growth set is in the shard's snapshot: a node started again with the flags
    it had before (two shards, version 1; an operator who never updated its configuration)
    takes messages by the grown map, and refuses an id that moved."""
    cluster, _ = grown
    node = cluster.shards[0][0]
    parts, _ = read_snapshot(str(node.data / "raft" / "snapshot"))
    in_snapshot = parts[8]  # the shard map (a finalized cluster's version follows it)
    assert in_snapshot is not None and in_snapshot[0] == 2
    cluster.stop(node)
    grown_as = cluster.nodes, cluster.shards, cluster.map_version, cluster.grown_from
    cluster.shards = grown_as[1][:2]
    cluster.nodes = [member for shard in cluster.shards for member in shard]
    cluster.map_version, cluster.grown_from = 1, 0
    try:
        cluster.start(node)
    finally:
        cluster.nodes, cluster.shards, cluster.map_version, cluster.grown_from = grown_as
    assert cluster.leader(timeout_s=60, shard=0) == node
    info = node.info(timeout_s=5)
    assert info is not None and (info.map_version, len(info.shards)) == (2, 4)
    moved = next(probe for probe in (f"probe-{n}" for n in range(1_000))
                 if shard_of(probe, 2) == 0 and shard_of(probe, 4) >= 2)
    with pytest.raises(grpc.RpcError) as refused:
        node.stub.Schedule(pb.ScheduleRequest(messages=[pb.Message(
            id=moved, topic="grow", body=b"x",
            deliver_at_ms=int(time.time() * 1000) + 3_600_000)]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "of 4" in (refused.value.details() or "")


def test_a_cluster_of_one_shard_grows_and_its_running_consumer_follows(tmp_path: Path) -> None:
    """The common start: one shard, then two. A consumer started on the one shard receives
    the second's messages too, and an id of the one shard, sent again, is still its."""
    with LocalCluster(tmp_path, 1) as cluster, cluster.client(timeout_s=60) as client:
        cluster.leader(timeout_s=60)
        topic = f"one-{uuid.uuid4().hex[:8]}"
        first = client.schedule_many([Message(topic, "x", delay_ms=0, id=f"{topic}-{n}")
                                      for n in range(50)])
        got: list[Received] = []
        with client.consume(topic, prefetch=16) as consumer:
            for message in consumer:
                got.append(message)
                message.ack()
                if len(got) == 50:
                    break
            assert cluster.grow(1) == 2
            later = client.schedule_many([Message(topic, "y", delay_ms=0, id=f"{topic}-{n}")
                                          for n in range(50, 150)])
            assert {handle_shard(r.handle) for r in later} == {0, 1}
            for message in consumer:
                got.append(message)
                message.ack()
                if len(got) == 150:
                    break
        assert sorted(m.id for m in got) == sorted(r.id for r in first + later)
        again = client.schedule_many([Message(topic, "x", delay_ms=0, id=f"{topic}-{n}")
                                      for n in range(50)])
        assert [(r.duplicate, r.handle) for r in again] == [(True, r.handle) for r in first]
